"""The /admin web page: server-rendered (Jinja2, autoescaped), no JavaScript.

Pages: the dashboard (pending rules with their evidence, votes, validation and last dry-run;
recent jobs with diagnosis, action, suspect nodes, compression, progress and a small loss
curve, searchable; recent history), one rule (versions, audit, edit, dry-run), one job (its
kept lines, and a form to confirm or correct its diagnosis). Every change is a POST
form with a CSRF token, checked against a signed session cookie (service.admin.auth); a request
from another origin is refused. All log text is escaped by the templates.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from sqlalchemy import String, cast, or_, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from rules.model import RuleStatus
from rules.taxonomy import REASONS, Origin
from service.admin import review
from service.admin.api import ConfirmBody
from service.store import jobs as store
from service.store.incidents import confirm_job as confirm_diagnosis
from service.store.models import Job
from service.admin.auth import SESSION_COOKIE, SESSION_TTL_S, AdminTokens, WebSession
from service.errors import FaultlineError

router = APIRouter(prefix="/admin", include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).resolve().parent / "templates"))
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # not no-referrer: with it a browser sends `Origin: null` on every form post (Fetch
    # standard), which the same-origin check must refuse; same-origin still sends nothing
    # to other sites
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
PENDING_ON_PAGE = 50
JOBS_ON_PAGE = 20
MAX_SEARCH_CHARS = 200
KEPT_LINES_ON_PAGE = 400
AXIS_LEFT = 56
AXIS_BOTTOM = 20
"""Room for the loss labels left of a job page's loss curve, and for the step labels under it."""


def when(value: Any) -> str:
    """An ISO time or datetime as `YYYY-MM-DD HH:MM:SS` (UTC, as stored)."""
    text = value.isoformat() if hasattr(value, "isoformat") else str(value or "")
    return text[:19].replace("T", " ")


def details(value: Any) -> str:
    """An audit entry's details as `key: value; ...`, lists joined, empty ones left out."""
    if not isinstance(value, dict):
        return str(value or "")
    parts = []
    for key, item in value.items():
        if item in (None, "", [], {}):
            continue
        if isinstance(item, list | tuple):
            item = ", ".join(map(str, item))
        parts.append(f"{key}: {item}")
    return "; ".join(parts)


def check(result: Any) -> tuple[bool, str]:
    """A stored validation result as (passed, what it says). Results are "ok" or "failed:
    <detail>" (agents.validation) and "ok: <count> confirmed lines" (service.agents.failure)."""
    text = str(result or "").strip()
    verdict, _, detail = text.partition(":")
    if verdict.strip() == "ok":
        return True, detail.strip()
    return False, detail.strip() if verdict.strip() == "failed" else text


templates.env.filters["when"] = when
templates.env.filters["details"] = details
templates.env.filters["check"] = check
templates.env.globals["reasons"] = sorted(REASONS.values(), key=lambda r: r.id)
templates.env.globals["origins"] = [o.value for o in Origin]


def _tokens(request: Request) -> AdminTokens:
    return request.app.state.admin_tokens


def _session(request: Request) -> WebSession | None:
    """The signed-in session of the request's cookie: signed, unexpired, and not signed out."""
    session = _tokens(request).read_session(request.cookies.get(SESSION_COOKIE))
    if session is None:
        return None
    with request.app.state.ctx.db.session() as db:
        return None if store.session_ended(db, session.ref) else session


def _page(request: Request, name: str, context: dict[str, Any], *, status: int = 200,
          session: WebSession | None = None) -> HTMLResponse:
    context = {**context, "session": session,
               "csrf": _tokens(request).csrf_token(session) if session else "",
               "message": _done_message(request)}
    response = templates.TemplateResponse(request, name, context, status_code=status)
    response.headers.update(SECURITY_HEADERS)
    return response


def _to_login() -> RedirectResponse:
    return RedirectResponse("/admin/login", status_code=303)


DONE = {
    "approve": "Approved {rule}: it applies to the next diagnosis.",
    "reject": "Rejected {rule}.",
    "edit": "Saved a new version of {rule}.",
    "confirm": "Confirmed the diagnosis: it joins the known incidents.",
    "correct": "Corrected the diagnosis: the correction joins the known incidents.",
}
"""What the page says after an action. The redirect names the action and the rule, not the
text: a link with text of its own in the query would put anyone's words on this page."""


def _back(path: str, action: str, rule_id: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?{urlencode({'done': action, 'rule': rule_id})}", status_code=303)


def _done_message(request: Request) -> str:
    template = DONE.get(request.query_params.get("done", ""))
    rule_id = request.query_params.get("rule", "")
    if template is None or ("{rule}" in template and not review.RULE_ID_RE.fullmatch(rule_id)):
        return ""
    return template.format(rule=rule_id)


def _same_origin(request: Request) -> bool:
    """A form post from this site: Origin (or Referer) names this host, or is absent."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return origin != "null"
    return urlparse(origin).netloc == request.headers.get("host", "")


async def _form(request: Request) -> tuple[WebSession | None, dict[str, str], Response | None]:
    """The signed-in session and the form of a POST, or the response refusing it."""
    session = _session(request)
    if session is None:
        return None, {}, _to_login()
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    if not _same_origin(request) or not _tokens(request).check_csrf(session, fields.get("csrf")):
        response = HTMLResponse("<h1>403</h1><p>The form is stale or from another site: reload the page.</p>",
                                status_code=403)
        response.headers.update(SECURITY_HEADERS)
        return session, fields, response
    return session, fields, None


# -- sign in ---------------------------------------------------------------------------------------
@router.get("/login")
def login_page(request: Request) -> Response:
    if not _tokens(request):
        return HTMLResponse("<h1>404</h1><p>The admin page is disabled.</p>", status_code=404)
    return _page(request, "login.html", {"error": ""})


@router.post("/login")
async def login(request: Request) -> Response:
    tokens = _tokens(request)
    if not tokens:
        return HTMLResponse("<h1>404</h1><p>The admin page is disabled.</p>", status_code=404)
    if not _same_origin(request):
        return _page(request, "login.html", {"error": "Sign in from this site."}, status=403)
    form = await request.form()
    token = form.get("token")
    owner = tokens.owner(token.strip()) if isinstance(token, str) and token.strip() else None
    if owner is None:
        return _page(request, "login.html", {"error": "That token is not valid."}, status=403)
    _, cookie = tokens.new_session(owner)
    response = RedirectResponse("/admin", status_code=303)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=SESSION_TTL_S, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/admin")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    session, _, refused = await _form(request)
    if refused is not None:
        return refused
    with request.app.state.ctx.db.session() as db:  # the cookie is refused from now on, a copy of it too
        store.audit(db, session.label, store.SIGN_OUT, session.ref)
    response = _to_login()
    response.delete_cookie(SESSION_COOKIE, path="/admin")
    return response


# -- pages -----------------------------------------------------------------------------------------
@router.get("")
def dashboard(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    ctx = request.app.state.ctx
    q = request.query_params.get("q", "").strip()[:MAX_SEARCH_CHARS]
    with ctx.db.session() as db:
        rows, pending_total = store.list_rules(db, status=RuleStatus.PENDING.value, limit=PENDING_ON_PAGE)
        pending = [_with_last_dry_run(db, review.rule_summary(r)) for r in rows]
        jobs = [_job_view(j) for j in search_jobs(db, q, limit=JOBS_ON_PAGE)]
        history, _ = store.audit_entries(db, action="rule.", limit=25)
        counts = review.status_counts(db)
    return _page(request, "dashboard.html", {
        "pending": pending, "pending_total": pending_total, "jobs": jobs, "q": q, "jobs_limit": JOBS_ON_PAGE,
        "history": [store.audit_to_dict(e) for e in history], "counts": counts}, session=session)


def search_jobs(db: Session, text: str, *, limit: int) -> list[Job]:
    """The newest jobs; with `text`, those whose name, reason, external id or suspect nodes
    hold it, in any case. The text is a bound parameter with LIKE's wildcards escaped, and
    the suspect nodes are read as the JSON text of the diagnosis's list, which SQLite and
    PostgreSQL both give."""
    query = select(Job).order_by(Job.created_at.desc()).limit(limit)
    if text:
        nodes = cast(Job.diagnosis["suspect_nodes"], String)
        query = query.where(or_(*(column.icontains(text, autoescape=True)
                                  for column in (Job.name, Job.reason, Job.external_id, nodes))))
    return list(db.scalars(query))


@router.get("/rule/{rule_id}")
def rule_page(request: Request, rule_id: str) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    return _rule_page(request, session, rule_id)


def _rule_page(request: Request, session: WebSession, rule_id: str, *, status: int = 200, error: str = "",
               dry_run: dict | None = None, form: dict | None = None) -> Response:
    ctx = request.app.state.ctx
    with ctx.db.session() as db:
        row = store.get_rule(db, rule_id)
        if row is None:
            return _page(request, "missing.html", {"what": f"rule {review.shown(rule_id)}"}, status=404,
                         session=session)
        rule = review.rule_detail(db, row)
    rule["examples_text"] = "\n".join(review.examples_of(row))
    return _page(request, "rule.html", {"rule": rule, "error": error, "dry_run": dry_run, "form": form or {}},
                 status=status, session=session)


@router.get("/job/{job_id}")
def job_page(request: Request, job_id: str) -> Response:
    session = _session(request)
    if session is None:
        return _to_login()
    return _job_page(request, session, job_id)


def _job_page(request: Request, session: WebSession, job_id: str, *, status: int = 200, error: str = "",
              form: dict | None = None) -> Response:
    ctx = request.app.state.ctx
    with ctx.db.session() as db:
        job = store.get_job(db, job_id)
        if job is None:
            return _page(request, "missing.html", {"what": f"job {review.shown(job_id)}"}, status=404,
                         session=session)
        view = _job_view(job, width=720, height=220, axes=True)
        kept = store.kept_lines(db, job_id, limit=KEPT_LINES_ON_PAGE)
        # confirm_job's audit entry says what its meta copy does not: when, and whether it corrected
        confirmed, _ = store.audit_entries(db, target=job_id, action="job.confirm", limit=1)
    return _page(request, "job.html", {
        "job": view, "kept": kept, "limit": KEPT_LINES_ON_PAGE, "error": error, "form": form or {},
        "confirmed": store.audit_to_dict(confirmed[0]) if confirmed else None},
                 status=status, session=session)


# -- actions ---------------------------------------------------------------------------------------
@router.post("/rule/{rule_id}/approve")
async def approve(request: Request, rule_id: str) -> Response:
    session, form, refused = await _form(request)
    if refused is not None:
        return refused
    return await _act(request, session, rule_id, "approve",
                      lambda db: review.approve(db, rule_id, actor=session.label, note=form.get("note", "")), form)


@router.post("/rule/{rule_id}/reject")
async def reject(request: Request, rule_id: str) -> Response:
    session, form, refused = await _form(request)
    if refused is not None:
        return refused
    return await _act(request, session, rule_id, "reject",
                      lambda db: review.reject(db, rule_id, actor=session.label, reason=form.get("reason", "")), form)


@router.post("/rule/{rule_id}/edit")
async def edit(request: Request, rule_id: str) -> Response:
    session, form, refused = await _form(request)
    if refused is not None:
        return refused
    ctx = request.app.state.ctx
    changes: dict[str, Any] = {k: form[k] for k in ("pattern", "description", "scope") if k in form}
    examples = [line for line in form.get("examples", "").replace("\r\n", "\n").split("\n") if line.strip()]
    if examples:
        changes["examples"] = examples
    with ctx.db.session() as db:
        row = store.get_rule(db, rule_id)
        if row is not None:  # only what the person changed
            current = review.row_fields(row)
            current["examples"] = review.examples_of(row)
            changes = {k: v for k, v in changes.items() if v != current.get(k)}
    return await _act(request, session, rule_id, "edit",
                      lambda db: ctx.review.edit(db, rule_id, changes, actor=session.label), form)


@router.post("/rule/{rule_id}/dry-run")
async def dry_run(request: Request, rule_id: str) -> Response:
    session, form, refused = await _form(request)
    if refused is not None:
        return refused
    ctx = request.app.state.ctx
    changes = {"pattern": form["pattern"]} if form.get("pattern", "").strip() else {}

    def run() -> dict:
        with ctx.db.session() as db:
            return ctx.review.dry_run(db, rule_id, changes, actor=session.label)

    try:
        result = await run_in_threadpool(run)
    except FaultlineError as exc:
        return _rule_page(request, session, rule_id, status=exc.status_code, error=str(exc), form=form)
    ctx.metrics.admin_action("dry_run")
    return _rule_page(request, session, rule_id, dry_run=result, form=form)


@router.post("/job/{job_id}/confirm")
async def confirm_job(request: Request, job_id: str) -> Response:
    """The page's twin of POST /admin/jobs/{job_id}/confirm: the same body, checked by the
    same model, and the same function."""
    session, form, refused = await _form(request)
    if refused is not None:
        return refused
    try:
        body = ConfirmBody(reason=form.get("reason") or None, origin=form.get("origin") or None,
                           note=form.get("note", "").strip())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return _job_page(request, session, job_id, status=422, error=problems, form=form)
    ctx = request.app.state.ctx

    def run() -> None:
        with ctx.db.session() as db:
            confirm_diagnosis(db, job_id, actor=session.label, reason_id=body.reason, origin=body.origin,
                              note=body.note)

    try:
        await run_in_threadpool(run)
    except FaultlineError as exc:
        return _job_page(request, session, job_id, status=exc.status_code, error=str(exc), form=form)
    ctx.metrics.admin_action("confirm")
    done = "correct" if body.reason or body.origin else "confirm"
    return RedirectResponse(f"/admin/job/{quote(job_id, safe='')}?{urlencode({'done': done})}",
                            status_code=303)


async def _act(request: Request, session: WebSession, rule_id: str, action: str, fn,
               form: dict[str, str]) -> Response:
    ctx = request.app.state.ctx

    def run() -> None:
        with ctx.db.session() as db:
            fn(db)

    try:
        await run_in_threadpool(run)
    except FaultlineError as exc:
        return _rule_page(request, session, rule_id, status=exc.status_code, error=str(exc), form=form)
    ctx.metrics.admin_action(action)
    target = form.get("next") if form.get("next") in ("/admin", f"/admin/rule/{rule_id}") else f"/admin/rule/{rule_id}"
    return _back(target, action, rule_id)


# -- views -----------------------------------------------------------------------------------------
def _with_last_dry_run(db, rule: dict[str, Any]) -> dict[str, Any]:
    entries, _ = store.audit_entries(db, target=rule["id"], action="rule.dry_run", limit=1)
    rule["last_dry_run"] = store.audit_to_dict(entries[0]) if entries else None
    return rule


def _job_view(job, *, width: int = 160, height: int = 36, axes: bool = False) -> dict[str, Any]:
    diagnosis = job.diagnosis or {}
    comp = diagnosis.get("compression") or {}
    lines_in, kept = comp.get("lines_in") or 0, comp.get("lines_kept") or 0
    return {
        "id": job.id, "name": job.name or "(anonymous)", "status": job.status, "framework": job.framework,
        "created_at": job.created_at, "root_cause": diagnosis.get("root_cause"), "action": diagnosis.get("action"),
        "mitigation": diagnosis.get("mitigation"), "progress": diagnosis.get("progress") or {},
        "lines_in": lines_in, "lines_kept": kept,
        "kept_share": f"{kept / lines_in:.1%}" if lines_in else "-",
        "suspect_nodes": list(diagnosis.get("suspect_nodes") or []),
        "other_errors": diagnosis.get("other_errors") or [], "filtered": (diagnosis.get("filtered") or [])[:20],
        "curve": loss_polyline((job.meta or {}).get("loss_curve") or [], width, height, axes=axes),
        "width": width, "height": height,
    }


def loss_polyline(points: list, width: int, height: int, pad: int = 2, *, axes: bool = False) -> dict[str, Any] | None:
    """SVG polyline coordinates for [step, loss] pairs (numbers only, computed here); with
    `axes`, room is left on the left and at the bottom for the loss and step labels."""
    clean = [(float(s), float(v)) for s, v in points
             if isinstance(s, int | float) and isinstance(v, int | float) and math.isfinite(v)]
    if len(clean) < 2:
        return None
    steps, losses = [s for s, _ in clean], [v for _, v in clean]
    s0, s1, lo, hi = min(steps), max(steps), min(losses), max(losses)
    left, top, right, bottom = (AXIS_LEFT, 8, width - 8, height - AXIS_BOTTOM) if axes else (
        pad, pad, width - pad, height - pad)
    sx = (right - left) / ((s1 - s0) or 1.0)
    sy = (bottom - top) / ((hi - lo) or 1.0)
    coords = " ".join(f"{left + (s - s0) * sx:.1f},{bottom - (v - lo) * sy:.1f}" for s, v in clean)
    return {"points": coords, "first": clean[0], "last": clean[-1], "min": lo, "max": hi,
            "box": {"left": left, "top": top, "right": right, "bottom": bottom}, "axes": axes}
