"""Jobs: stored diagnoses, and live jobs fed by the sidecar (create, append, finish)."""

from __future__ import annotations

from typing import Annotated, Any

from service.api.schema import JOB_ERRORS, AppendAnswer, JobAnswer, JobList, SourceList, answers
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service.store import jobs as store
from service.deps import INGEST, MAX_OFFSET, READ, SOURCES, ContextDep, LiveDep
from service.errors import BadInput, NotFound
from service.sidecar.wire import READ_AGE_HEADER
from service.ingest.lines import LineDecoder, check_content_length, gzip_encoded
from service.live.ledger import ChunkRef, checksum
from service.store.models import Job

router = APIRouter(responses=JOB_ERRORS)

"""Seconds since the sidecar read the chunk: a resend after an outage keeps its real time."""


def job_view(job: Job) -> dict[str, Any]:
    def when(value: Any) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": job.id, "name": job.name, "family": job.family, "framework": job.framework,
        "tags": job.tags or [], "status": job.status, "live": job.live, "external_id": job.external_id,
        "lines_received": job.lines_received, "bytes_received": job.bytes_received,
        "created_at": when(job.created_at), "finished_at": when(job.finished_at),
        "last_output_at": when(job.last_output_at), "last_progress_at": when(job.last_progress_at),
        "exit_code": job.exit_code, "diagnosis": job.diagnosis,
    }


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=512)
    framework: str | None = Field(default=None, max_length=64)
    tags: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=64)
    external_id: str | None = Field(default=None, max_length=256, description=(
        "the scheduler's job id: sidecars of several nodes that give the same one share one job"))


class JobFinish(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exit_code: int | None = Field(default=None, ge=-255, le=65535, description="the command's exit status")


@router.post("/jobs", status_code=201, dependencies=[INGEST],
             response_model=None, responses={**answers(JobAnswer, "The new live job.", 201),
                                             **answers(JobAnswer, "The open job of that external_id, joined.")})
def create_job(body: JobCreate, live: LiveDep, response: Response) -> dict[str, Any]:
    """Create a live job; with `external_id`, the open job of that id (200) if there is one."""
    tags = tuple(t.strip() for tag in body.tags for t in tag.split(",") if t.strip())
    job, created = live.create(name=body.name, framework=body.framework or None, tags=tags,
                               external_id=body.external_id or None)
    if not created:
        response.status_code = 200
    return job_view(job)


async def read_chunk(request: Request, *, max_bytes: int, max_ratio: int, what: str = "chunk") -> bytes:
    """The request body as the file holds it (gzip-decoded if so encoded), through the one
    ingest decoder: refused past max_bytes (413), or when it looks binary (400)."""
    check_content_length(request.headers.get("content-length"), max_bytes, what)
    gzip = gzip_encoded(request.headers.get("content-encoding"))
    decoder = LineDecoder(name=what, gzip=gzip, max_output=max_bytes, max_ratio=max_ratio, transcode=False)
    parts = [piece async for data in request.stream() for piece in decoder.decode(data)]
    decoder.finish()
    return b"".join(parts)


def _read_age(request: Request) -> float:
    raw = request.headers.get(READ_AGE_HEADER)
    if raw is None:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise BadInput(f"{READ_AGE_HEADER} must be a number of seconds, got {raw[:32]!r}") from None


@router.post("/jobs/{job_id}/logs", dependencies=[INGEST], response_model=None,
             responses=answers(AppendAnswer, "The chunk is counted."))
async def append_logs(
    job_id: str, request: Request, ctx: ContextDep, live: LiveDep,
    source: Annotated[str, Query(min_length=1, max_length=512, description="the file's name in diagnoses")],
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="byte offset in the file where the chunk starts")],
    end: Annotated[int | None, Query(ge=0, le=MAX_OFFSET, description="byte offset where it ends (default offset + body)")] = None,
    file: Annotated[str, Query(max_length=128, description="which physical file (fingerprint)")] = "",
    cut: Annotated[bool, Query(description="the range ends with the rest of an over-long line that was skipped, "
                                           "not sent: only then may `end` lie past offset + body")] = False,
) -> dict[str, Any]:
    """Append a chunk of one file's lines to a live job; idempotent by source, file and offset."""
    settings = ctx.settings
    body = await read_chunk(request, max_bytes=settings.max_chunk_bytes, max_ratio=settings.max_gzip_ratio)
    end = offset + len(body) if end is None else end
    if end < offset:
        raise BadInput(f"end ({end}) is before offset ({offset})")
    if end > offset + len(body) and not cut:
        # bytes claimed but not sent would count as received: only a skipped line's rest may
        # (a range shorter than its body is a partial last line the sender ended with a newline)
        raise BadInput(f"end ({end}) lies past offset + the body's {len(body)} bytes ({offset + len(body)}); "
                       "a range with bytes not sent needs cut=1 (the rest of an over-long line that was skipped)")
    if end == offset:
        raise BadInput("empty chunk: the body holds no bytes and covers none of the file")
    chunk = ChunkRef(source=source, file_id=file, offset=offset, end=end, checksum=checksum(body))
    return await run_in_threadpool(live.append, job_id, chunk, body, read_age_s=_read_age(request))


@router.post("/jobs/{job_id}/finish", dependencies=[INGEST],
             response_model=None, responses=answers(JobAnswer, "The job with its final diagnosis."))
def finish_job(job_id: str, live: LiveDep, body: JobFinish | None = None) -> dict[str, Any]:
    """The job ended: the final diagnosis, with its exit status."""
    return job_view(live.finish(job_id, body.exit_code if body else None))


@router.get("/jobs/{job_id}/sources", dependencies=[SOURCES],
            response_model=None, responses=answers(SourceList, "Each file as received."))
def job_sources(job_id: str, live: LiveDep) -> dict[str, Any]:
    """The files of a live job as received: offsets, lines, bytes and a CRC-32 of each."""
    data = live.sources(job_id)
    return {"data": data, "count": len(data)}


@router.get("/jobs/{job_id}", dependencies=[READ], response_model=None, responses=answers(JobAnswer, "The job."))
def get_job(job_id: str, ctx: ContextDep, live: LiveDep) -> dict[str, Any]:
    """A job with its latest diagnosis (a live job silent too long is marked stalled first)."""
    live.check_stall(job_id)
    with ctx.db.session() as session:
        job = store.get_job(session, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job_view(job)


@router.get("/jobs", dependencies=[READ], response_model=None,
            responses=answers(JobList, "The jobs found, newest first."))
def list_jobs(ctx: ContextDep,
              name: Annotated[str | None, Query(max_length=512)] = None,
              status: Annotated[str | None, Query(max_length=16)] = None,
              external_id: Annotated[str | None, Query(max_length=256)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0) -> dict[str, Any]:
    """Jobs, newest first; `name` finds the jobs of that name, `external_id` those of a scheduler id."""
    with ctx.db.session() as session:
        jobs = store.find_jobs(session, name=name, status=status, external_id=external_id, limit=limit,
                               offset=offset)
        return {"data": [job_view(j) for j in jobs], "count": len(jobs)}
