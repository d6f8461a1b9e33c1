"""POST /diagnose: a whole log in, a diagnosis out."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from rules.attempts import apply_budget
from service.api.schema import DIAGNOSE_ERRORS, DiagnoseAnswer, answers
from service.store import jobs as store
from service.deps import INGEST, ContextDep
from service.errors import BadInput, UnsupportedMediaType
from rules.job import JobMeta, JobRun
from service.ingest.lines import check_content_length, gzip_encoded
from service.ingest.upload import feed_multipart, feed_plain
from service.threads import in_turn

router = APIRouter(responses=DIAGNOSE_ERRORS)

_TEXT_TYPES = ("text/plain", "text/x-log", "application/octet-stream", "application/gzip", "application/x-gzip")


def job_meta(job_name: str, framework: str | None, tags: list[str]) -> JobMeta:
    flat = tuple(t.strip() for tag in tags for t in tag.split(",") if t.strip())
    return JobMeta(name=job_name, framework=framework or None, tags=flat)


async def read_log_body(request: Request, run: JobRun, *, max_bytes: int, max_ratio: int,
                        cpu: asyncio.Semaphore | None = None) -> None:
    """Stream the request body (plain, gzip or multipart) into the job; `cpu`: the process's
    slots for CPU work (service.threads.in_turn)."""
    check_content_length(request.headers.get("content-length"), max_bytes)
    content_type = request.headers.get("content-type", "text/plain")
    media = content_type.split(";", 1)[0].strip().lower()
    gzip_coded = gzip_encoded(request.headers.get("content-encoding"))
    if media == "multipart/form-data":
        await feed_multipart(run, request.stream(), content_type, max_bytes=max_bytes, max_ratio=max_ratio, cpu=cpu)
    elif media in _TEXT_TYPES or media.startswith("text/"):
        gzip = gzip_coded or media in ("application/gzip", "application/x-gzip")
        await feed_plain(run, request.stream(), name="body", gzip=gzip, max_bytes=max_bytes, max_ratio=max_ratio,
                         cpu=cpu)
    else:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {media!r}: send text/plain (optionally gzip-encoded) or multipart/form-data")
    if not run.sources or all(src.stream.lines_in == 0 for src in run.sources.values()):
        raise BadInput("empty log: the body holds no lines")


# the body is read as a stream (not parsed by FastAPI), so its shape is declared here for
# the OpenAPI schema: clients and the schema fuzz test see what the route takes
_BODY = {"requestBody": {"required": True, "content": {
    "text/plain": {"schema": {"type": "string", "description": "the log (Content-Encoding: gzip allowed)"}},
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "files": {"type": "array", "items": {"type": "string", "format": "binary"},
                  "description": "one file per rank or node; .gz files are read as gzip"}}}},
}}}


@router.post("/diagnose", openapi_extra=_BODY, dependencies=[INGEST],
             response_model=None, responses=answers(DiagnoseAnswer, "The diagnosis, stored under `job_id`."))
async def diagnose(
    request: Request, ctx: ContextDep,
    job_name: Annotated[str, Query(max_length=512, description="job name; finds its family's learned rules")] = "",
    framework: Annotated[str | None, Query(max_length=64)] = None,
    tags: Annotated[list[str], Query(description="tags, repeated or comma-separated")] = [],  # noqa: B006
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$",
        description="a retry with the same key returns the stored diagnosis instead of storing another")] = None,
    external_id: Annotated[str | None, Query(min_length=1, max_length=256, description=(
        "the scheduler's job id: attempts that share it count against the restart budget"))] = None,
) -> dict[str, Any]:
    """Diagnose a whole job log sent as text/plain (optionally gzip) or as multipart files."""
    if idempotency_key is not None:
        stored = await run_in_threadpool(_stored_result, ctx, idempotency_key)
        if stored is not None:
            return stored
    meta = job_meta(job_name, framework, tags)
    settings = ctx.settings
    # a slot per upload being processed: the others wait with their bodies unread, so memory
    # and CPU threads stay bounded however many clients send at once
    async with request.app.state.upload_slots:
        run = await run_in_threadpool(ctx.new_run, meta)  # reads the rule-set version: I/O
        cpu = request.app.state.cpu_slots
        await read_log_body(request, run, max_bytes=settings.max_request_bytes, max_ratio=settings.max_gzip_ratio,
                            cpu=cpu)
        # the body is read: from now on the only message is the client's going away
        gone = asyncio.create_task(_disconnected(request))
        try:
            diagnosis = await in_turn(cpu, run.finish)
            await asyncio.sleep(0)  # let the loop see a close that came while it diagnosed
        finally:
            gone.cancel()
        if gone.done() and not gone.cancelled() and gone.result():
            # the client gave up waiting (a timeout on a big upload): no one will read the
            # answer, and a retry with its Idempotency-Key must not find a job it never got
            raise ClientDisconnect()
        try:
            job_id, result = await run_in_threadpool(_store, ctx, run, meta, diagnosis, idempotency_key, external_id)
        except IntegrityError:
            # the same key was stored meanwhile (a retry that reached another replica first)
            stored = await run_in_threadpool(_stored_result, ctx, idempotency_key) if idempotency_key else None
            if stored is None:
                raise
            return stored
    return {"job_id": job_id, **result}


async def _disconnected(request: Request) -> bool:
    """True once the client has closed the connection (after its body, nothing else comes)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return True


def _stored_result(ctx, key: str) -> dict[str, Any] | None:
    with ctx.db.session() as session:
        job = store.job_by_idempotency_key(session, key)
        if job is None or job.diagnosis is None:
            return None
        return {"job_id": job.id, **job.diagnosis}


def _store(ctx, run: JobRun, meta: JobMeta, diagnosis, idempotency_key: str | None,
           external_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """One transaction: the job, its diagnosis, its kept lines and the rule hits are stored
    together, so a 200 means all of it is stored and an error means none of it is. With an
    `external_id`, the job's earlier attempts count against the restart budget."""
    result = diagnosis.to_dict()
    with ctx.db.session() as session:
        if external_id:
            result = apply_budget(result, store.earlier_attempts(session, external_id), ctx.settings.restart_budget)
        job = store.create_job(session, name=meta.name, family=meta.family,
                               framework=meta.framework, tags=meta.tags, idempotency_key=idempotency_key)
        job.bytes_received = run.bytes_in
        curve = run.loss_curve()
        if curve:
            job.meta = {**(job.meta or {}), "loss_curve": curve}
        store.save_diagnosis(session, job, result, finished=True)
        job.external_id = external_id  # finished already: an attempt, never the open job of that id
        store.save_kept_lines(session, job.id, run.compressed.lines())
        session.flush()
        ctx.after_run(run, diagnosis, entry="diagnose", session=session, job_id=job.id)
        return job.id, result
