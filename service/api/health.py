"""Liveness and readiness."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from service.deps import ContextDep

router = APIRouter()


class Health(BaseModel):
    status: Literal["ok", "unhealthy"]
    database: str
    """`ok`, or the kind of error the database check met."""
    backend: str
    rules_version: int | None = None
    failure_agent: Literal["ready", "loading", "on first use", "off"] | None = None


@router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": (
    "The database cannot be reached; `database` names the kind of error.")}})
def healthz(ctx: ContextDep, request: Request) -> JSONResponse:
    """Health of the service and its database: 503 while the database cannot be reached.

    `rules_version` is the rule set this worker answers with. It is brought up to date here,
    as any request would: a worker that served no diagnosis since a rule was approved
    elsewhere would otherwise report the set it last saw, not the one it now applies.
    `failure_agent`: `ready`, `loading` (built in the background since start), `on first use`
    or `off`; the service is healthy either way (rules answer meanwhile).
    """
    try:
        with ctx.db.session() as session:
            session.execute(text("SELECT 1"))
        ctx.rulebook.refresh()
    except SQLAlchemyError as exc:
        return JSONResponse({"status": "unhealthy", "database": type(exc).__name__,
                             "backend": ctx.db.backend}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok", "backend": ctx.db.backend,
                         "rules_version": ctx.rulebook.version, "failure_agent": _failure_agent_state(ctx, request)})


def _failure_agent_state(ctx, request: Request) -> str:
    agent = ctx.failure_agent
    if agent is None or not ctx.settings.failure_agent:
        return "off"
    if getattr(agent, "built", False):
        return "ready"
    preload = getattr(request.app.state, "failure_agent_preload", None)
    return "loading" if preload is not None and not preload.done() else "on first use"
