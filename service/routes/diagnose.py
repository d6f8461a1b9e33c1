"""POST /diagnose: a whole log in, a diagnosis out."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from rules.family import job_family
from service import store
from service.deps import ContextDep
from service.errors import BadInput, PayloadTooLarge, UnsupportedMediaType
from service.pipeline import JobMeta, JobRun
from service.upload import feed_multipart, feed_plain

router = APIRouter()

_TEXT_TYPES = ("text/plain", "text/x-log", "application/octet-stream", "application/gzip", "application/x-gzip")


def job_meta(job_name: str, framework: str | None, tags: list[str]) -> JobMeta:
    flat = tuple(t.strip() for tag in tags for t in tag.split(",") if t.strip())
    return JobMeta(name=job_name, framework=framework or None, tags=flat)


def check_length(request: Request, max_bytes: int) -> None:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadInput("invalid Content-Length header")
        if int(length) > max_bytes:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds the limit of {max_bytes} bytes")


async def read_log_body(request: Request, run: JobRun, *, max_bytes: int, max_ratio: int) -> None:
    """Stream the request body (plain, gzip or multipart) into the job."""
    check_length(request, max_bytes)
    content_type = request.headers.get("content-type", "text/plain")
    media = content_type.split(";", 1)[0].strip().lower()
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip", ""):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r}: send identity or gzip")
    if media == "multipart/form-data":
        await feed_multipart(run, request.stream(), content_type, max_bytes=max_bytes, max_ratio=max_ratio)
    elif media in _TEXT_TYPES or media.startswith("text/"):
        gzip = encoding == "gzip" or media in ("application/gzip", "application/x-gzip")
        await feed_plain(run, request.stream(), name="body", gzip=gzip, max_bytes=max_bytes, max_ratio=max_ratio)
    else:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {media!r}: send text/plain (optionally gzip-encoded) or multipart/form-data")
    if not run.sources or all(src.stream.lines_in == 0 for src in run.sources.values()):
        raise BadInput("empty log: the body holds no lines")


@router.post("/diagnose")
async def diagnose(
    request: Request, ctx: ContextDep,
    job_name: Annotated[str, Query(max_length=512, description="job name; finds its family's learned rules")] = "",
    framework: Annotated[str | None, Query(max_length=64)] = None,
    tags: Annotated[list[str], Query(description="tags, repeated or comma-separated")] = [],  # noqa: B006
) -> dict[str, Any]:
    """Diagnose a whole job log sent as text/plain (optionally gzip) or as multipart files."""
    meta = job_meta(job_name, framework, tags)
    run = ctx.new_run(meta)
    settings = ctx.settings
    await read_log_body(request, run, max_bytes=settings.max_request_bytes, max_ratio=settings.max_gzip_ratio)
    diagnosis = await run_in_threadpool(run.finish)
    result = diagnosis.to_dict()
    job_id = await run_in_threadpool(_store, ctx, run, meta, result)
    await run_in_threadpool(lambda: ctx.after_run(run, diagnosis, entry="diagnose", job_id=job_id))
    return {"job_id": job_id, **result}


def _store(ctx, run: JobRun, meta: JobMeta, result: dict[str, Any]) -> str:
    with ctx.db.session() as session:
        job = store.create_job(session, name=meta.name, family=job_family(meta.name),
                               framework=meta.framework, tags=meta.tags)
        job.bytes_received = run.bytes_in
        curve = run.loss_curve()
        if curve:
            job.meta = {**(job.meta or {}), "loss_curve": curve}
        store.save_diagnosis(session, job, result, finished=True)
        store.save_kept_lines(session, job.id, run.compressed.lines())
        return job.id
