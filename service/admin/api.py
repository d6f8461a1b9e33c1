"""The admin API: review of the rules the agents suggest (and of every stored rule).

Every route needs `Authorization: Bearer <FAULTLINE_ADMIN_TOKEN>` (401 without, 403 with a
wrong token). Every change is written to the audit log with the token owner's label. The
work is done by service.admin.review, shared with the /admin page and `faultline rules`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from service.api.schema import (ADMIN_ERRORS, AuditList, ConfirmAnswer, DryRunAnswer, ImportAnswer, Rule, RuleDetail,
                                RuleList, RuleVersions, answers)
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from rules.model import RuleKind, RuleStatus
from service.admin import review
from service.store import jobs as store
from service.admin.auth import require_admin
from service.deps import MAX_OFFSET, ContextDep
from service.errors import PayloadTooLarge, UnsupportedMediaType

router = APIRouter(prefix="/admin", tags=["admin"], responses=ADMIN_ERRORS)
Admin = Annotated[str, Depends(require_admin)]
MAX_PACK_BYTES = 8 << 20
PACK_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")


class ExportStatus(StrEnum):
    ACTIVE = "active"
    PENDING = "pending"
    REJECTED = "rejected"
    DISABLED = "disabled"
    ALL = "all"


class ApproveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(default="", max_length=review.MAX_NOTE_CHARS)


class RejectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(max_length=review.MAX_NOTE_CHARS, description="why the rule is rejected (required)")


class EditBody(BaseModel):
    """Fields to change; the rule is validated again as a whole. `examples` replaces the
    lines the rule must match (by default its evidence)."""

    model_config = ConfigDict(extra="forbid")
    pattern: str | None = None
    patterns: list[str] | None = None
    description: str | None = None
    scope: str | None = None
    examples: list[str] | None = None
    counter_examples: list[str] | None = None
    reason: str | None = None
    tier: str | None = None
    origin: str | None = None
    action: str | None = None
    mitigation: str | None = None


class DryRunBody(BaseModel):
    """Optional: try a changed pattern or scope without saving it."""

    model_config = ConfigDict(extra="forbid")
    pattern: str | None = None
    patterns: list[str] | None = None
    scope: str | None = None
    jobs: int = Field(default=review.DRY_RUN_JOBS, ge=1, le=review.DRY_RUN_MAX_JOBS,
                      description="how many of the most recent stored jobs to replay")


def _in_session(ctx, fn, *args, **kwargs) -> Any:
    """Run fn(session, ...) in one transaction, committed before the response is sent."""
    with ctx.db.session() as session:
        return fn(session, *args, **kwargs)


@router.get("/rules", response_model=None, responses=answers(RuleList, "The rules found."))
def list_rules(ctx: ContextDep, _admin: Admin,
               kind: RuleKind | None = None, status: RuleStatus | None = None,
               scope: Annotated[str | None, Query(max_length=256)] = None,
               source: Annotated[str | None, Query(max_length=64, description="prefix, e.g. log_agent")] = None,
               limit: Annotated[int, Query(ge=1, le=500)] = 50,
               offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0) -> dict[str, Any]:
    """Rules with their proposer, votes, evidence, validation and hits; newest first."""
    def run(session):
        rows, total = store.list_rules(session, kind=kind, status=status, scope=scope, source=source,
                                       limit=limit, offset=offset)
        return {"data": [review.rule_summary(r) for r in rows], "total": total, "limit": limit, "offset": offset}

    return _in_session(ctx, run)


@router.get("/rules/export", response_class=Response, responses={200: {
    "description": "A YAML rule pack (the format `POST /admin/rules/import` and `faultline rules import` read).",
    "content": {"application/yaml": {"schema": {
        "type": "object", "required": ["format", "rules"], "additionalProperties": True,
        "properties": {"format": {"type": "string", "examples": ["faultline-rules/1"]},
                       "exported_at": {"type": "string"}, "filter": {"type": "object"},
                       "rules": {"type": "array", "items": {"type": "object"}}}}}}}})
def export_rules(ctx: ContextDep, admin: Admin, kind: RuleKind | None = None,
                 status: ExportStatus = ExportStatus.ACTIVE,
                 scope: Annotated[str | None, Query(max_length=256)] = None) -> Response:
    """The rules as a YAML rule pack (active ones unless `status` says otherwise)."""
    text, count = _in_session(ctx, review.export_pack, kind=kind, scope=scope, actor=admin,
                              status=None if status is ExportStatus.ALL else status.value)
    ctx.metrics.admin_action("export")
    return Response(text, media_type="application/yaml", headers={
        "Content-Disposition": 'attachment; filename="faultline-rules.yaml"', "X-Rule-Count": str(count)})


@router.post("/rules/import", response_model=None, responses=answers(ImportAnswer, "What became of each rule."))
async def import_rules(request: Request, ctx: ContextDep, admin: Admin,
                       status: Literal["pending", "active"] = "pending",
                       on_conflict: Literal["skip", "replace", "fail"] = "skip") -> dict[str, Any]:
    """Import a YAML rule pack. Every rule is validated; nothing is stored unless all are
    valid (422 listing each invalid rule). Rules are `pending` unless `status=active`."""
    media = request.headers.get("content-type", "application/yaml").split(";", 1)[0].strip().lower()
    if media not in PACK_TYPES:
        raise UnsupportedMediaType(f"send the rule pack as application/yaml (or text/plain), not {media!r}")
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > MAX_PACK_BYTES:
        raise PayloadTooLarge(f"a rule pack is at most {MAX_PACK_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_PACK_BYTES:
            raise PayloadTooLarge(f"a rule pack is at most {MAX_PACK_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsupportedMediaType("the rule pack is not UTF-8 text") from None
    result = await run_in_threadpool(_in_session, ctx, ctx.review.import_pack, text, actor=admin, status=status,
                                     on_conflict=on_conflict)
    ctx.metrics.admin_action("import")
    return result


@router.get("/rules/{rule_id}", response_model=None,
            responses=answers(RuleDetail, "The rule, its versions and audit trail."))
def get_rule(rule_id: str, ctx: ContextDep, _admin: Admin) -> dict[str, Any]:
    """One rule: evidence lines, proposer, votes, validation results, hits, versions, audit."""
    return _in_session(ctx, lambda s: review.rule_detail(s, review.require_rule(s, rule_id)))


@router.get("/rules/{rule_id}/versions", response_model=None,
            responses=answers(RuleVersions, "Every version, newest first."))
def rule_versions(rule_id: str, ctx: ContextDep, _admin: Admin) -> dict[str, Any]:
    def run(session):
        review.require_rule(session, rule_id)
        return {"data": [store.version_to_dict(v) for v in store.rule_history(session, rule_id)]}

    return _in_session(ctx, run)


@router.post("/rules/{rule_id}/approve", response_model=None, responses=answers(Rule, "The rule, now active."))
def approve_rule(rule_id: str, ctx: ContextDep, admin: Admin, body: ApproveBody | None = None) -> dict[str, Any]:
    """Make a rule active; it applies to the next diagnosis."""
    def run(session):
        row = review.approve(session, rule_id, actor=admin, note=body.note if body else "")
        return review.rule_summary(row)

    result = _in_session(ctx, run)
    ctx.metrics.admin_action("approve")
    return result


@router.post("/rules/{rule_id}/reject", response_model=None, responses=answers(Rule, "The rule, now rejected."))
def reject_rule(rule_id: str, body: RejectBody, ctx: ContextDep, admin: Admin) -> dict[str, Any]:
    """Reject a rule, with a reason (422 without one). The Log Agent does not learn it again."""
    result = _in_session(ctx, lambda s: review.rule_summary(review.reject(s, rule_id, actor=admin,
                                                                           reason=body.reason)))
    ctx.metrics.admin_action("reject")
    return result


@router.patch("/rules/{rule_id}", response_model=None, responses=answers(Rule, "The rule as edited."))
def edit_rule(rule_id: str, body: EditBody, ctx: ContextDep, admin: Admin) -> dict[str, Any]:
    """Edit a rule; it is validated again (422 with the failed check) and gets a new version."""
    changes = body.model_dump(exclude_none=True)
    result = _in_session(ctx, lambda s: review.rule_summary(ctx.review.edit(s, rule_id, changes, actor=admin)))
    ctx.metrics.admin_action("edit")
    return result


@router.post("/rules/{rule_id}/dry-run", response_model=None, responses=answers(DryRunAnswer, "What would change."))
def dry_run(rule_id: str, ctx: ContextDep, admin: Admin, body: DryRunBody | None = None) -> dict[str, Any]:
    """Replay the most recent stored jobs without and with this rule: the jobs it matches,
    the lines it would drop or explain, and how each diagnosis would change."""
    body = body or DryRunBody()
    changes = body.model_dump(exclude_none=True, exclude={"jobs"})
    result = _in_session(ctx, ctx.review.dry_run, rule_id, changes, jobs=body.jobs, actor=admin)
    ctx.metrics.admin_action("dry_run")
    return result


class ConfirmBody(BaseModel):
    """Confirm a stored job's diagnosis as it is, or correct it: the confirmed root cause
    joins the Failure Agent's knowledge base and guards later rule suggestions."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(default=None, max_length=64, description="the right reason, if the diagnosis was wrong")
    origin: str | None = Field(default=None, max_length=16)
    line: str | None = Field(default=None, max_length=4000, description="the right root-cause line")
    note: str = Field(default="", max_length=review.MAX_NOTE_CHARS)


@router.post("/jobs/{job_id}/confirm", response_model=None,
             responses=answers(ConfirmAnswer, "The incident the job became."))
def confirm_job(job_id: str, ctx: ContextDep, admin: Admin, body: ConfirmBody | None = None) -> dict[str, Any]:
    """Confirm (or correct) a stored job's diagnosis; it becomes a known incident."""
    from service.store.incidents import confirm_job as confirm

    body = body or ConfirmBody()
    item = _in_session(ctx, confirm, job_id, actor=admin, reason_id=body.reason, origin=body.origin,
                       line=body.line, note=body.note)
    ctx.metrics.admin_action("confirm")
    return {"job_id": job_id, "incident": {"id": item.id, "reason": item.reason, "origin": item.origin,
                                           "category": item.category, "line": item.text,
                                           "confirmed_by": item.confirmed_by}}


@router.get("/audit", response_model=None, responses=answers(AuditList, "Audit entries, newest first."))
def audit_log(ctx: ContextDep, _admin: Admin,
              actor: Annotated[str | None, Query(max_length=128)] = None,
              action: Annotated[str | None, Query(max_length=64, description="prefix, e.g. rule.")] = None,
              target: Annotated[str | None, Query(max_length=256)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 100,
              offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0) -> dict[str, Any]:
    """Who did what and when, newest first."""
    def run(session):
        entries, total = store.audit_entries(session, actor=actor, action=action, target=target,
                                             limit=limit, offset=offset)
        return {"data": [store.audit_to_dict(e) for e in entries], "total": total, "limit": limit, "offset": offset}

    return _in_session(ctx, run)
