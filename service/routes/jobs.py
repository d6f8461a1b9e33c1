"""Stored jobs and their diagnoses."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service import store
from service.deps import SessionDep
from service.errors import NotFound
from service.models import Job

router = APIRouter()


def job_view(job: Job) -> dict[str, Any]:
    return {
        "id": job.id, "name": job.name, "family": job.family, "framework": job.framework,
        "tags": job.tags or [], "status": job.status, "live": job.live,
        "lines_received": job.lines_received, "bytes_received": job.bytes_received,
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "exit_code": job.exit_code, "diagnosis": job.diagnosis,
    }


@router.get("/jobs/{job_id}")
def get_job(job_id: str, session: SessionDep) -> dict[str, Any]:
    """A job with its latest diagnosis."""
    job = store.get_job(session, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job_view(job)


@router.get("/jobs")
def list_jobs(session: SessionDep,
              name: Annotated[str | None, Query(max_length=512)] = None,
              status: Annotated[str | None, Query(max_length=16)] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              offset: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
    """Jobs, newest first; `name` finds the jobs of that name."""
    jobs = store.find_jobs(session, name=name, status=status, limit=limit, offset=offset)
    return {"data": [job_view(j) for j in jobs], "count": len(jobs)}
