"""POST /ingest/records: a live job fed by the log shipper a cluster already runs (Fluent Bit's
`http` output, Vector's `http` sink) instead of our sidecar. Configurations: examples/fluent-bit
and examples/vector."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from service.api.jobs import read_chunk
from service.api.schema import JOB_ERRORS, RecordsAnswer, answers
from service.deps import INGEST, ContextDep, LiveDep
from service.ingest import records
from service.live import shipped

router = APIRouter(responses=JOB_ERRORS)

MAX_RECORDS = 100_000
"""Per request: Fluent Bit flushes chunks of about 2 MB, Vector batches of 10 MB at most."""

_BODY = {"requestBody": {"required": True, "content": {
    "application/x-ndjson": {"schema": {"type": "string", "description": (
        "JSON lines, one record per line: the line's text under `log` (Fluent Bit) or `message` (Vector), "
        "the file under `filename`, `file` or `path`, the byte offset where the line starts under `offset`")}},
    "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
}}}


@router.post("/ingest/records", openapi_extra=_BODY, dependencies=[INGEST],
             response_model=None, responses=answers(RecordsAnswer, "The records are counted, each file's lines once."))
async def ingest_records(
    request: Request, ctx: ContextDep, live: LiveDep,
    job_key: Annotated[str, Query(min_length=1, max_length=256, description=(
        "the scheduler's job id (e.g. ${SLURM_JOB_ID} in the shipper's config): records of every node that "
        "give the same key feed one live job, as sidecars with that --job-key do"))],
    job_name: Annotated[str, Query(max_length=512, description="job name; finds its family's learned rules")] = "",
    framework: Annotated[str | None, Query(max_length=64)] = None,
    tags: Annotated[list[str], Query(description="tags, repeated or comma-separated")] = [],  # noqa: B006
) -> dict[str, Any]:
    """Append a shipper's records to the open live job of `job_key` (created on its first
    records). Exactly once by each line's file and byte offset: a retried request counts once,
    a batch that skips ahead waits (503) for the one before it, a rotated file continues."""
    settings = ctx.settings
    body = await read_chunk(request, max_bytes=settings.max_chunk_bytes, max_ratio=settings.max_gzip_ratio,
                            what="request body")
    batches = records.parse(body, max_records=MAX_RECORDS)
    flat = tuple(t.strip() for tag in tags for t in tag.split(",") if t.strip())
    job, _ = await run_in_threadpool(live.create, name=job_name or job_key, framework=framework or None,
                                     tags=flat, external_id=job_key)
    files = [await run_in_threadpool(shipped.deliver, live, job.id, batch) for batch in batches]
    return {"job_id": job.id, "records": sum(len(b.offsets) for b in batches),
            "lines": sum(f["lines"] for f in files), "files": files}
