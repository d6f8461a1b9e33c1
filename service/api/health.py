"""Liveness and readiness, answered from memory.

A probe checks the database (and brings this worker's rule set up to date) every second in a
thread; /healthz only reads its last result. Under load the check itself, a connection from
the pool and a query, waited behind the diagnoses for the GIL and the thread pool, and a
load balancer's health check timed out on a service that was only busy (p99 260 ms with 20
clients uploading). A probe that has not finished a check for STALE_AFTER_S (a database that
hangs on connect) makes the service unhealthy all the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from service.context import Context

router = APIRouter()

PROBE_INTERVAL_S = 1.0
STALE_AFTER_S = 15.0


@dataclass
class HealthProbe:
    """The last check of the database and the rule set this worker answers with."""

    database: str = "not checked yet"
    checked_at: float = 0.0
    """time.monotonic() of the last finished check."""

    def check(self, ctx: Context) -> None:
        """Blocking: run in a thread. `rules_version` is brought up to date here, as any
        request would: a worker that served no diagnosis since a rule was approved elsewhere
        would otherwise report the set it last saw, not the one it now applies."""
        try:
            with ctx.db.session() as session:
                session.execute(text("SELECT 1"))
            ctx.rulebook.refresh()
            self.database = "ok"
        except SQLAlchemyError as exc:
            self.database = type(exc).__name__
        self.checked_at = time.monotonic()

    def state(self) -> str:
        """`ok`, the kind of error the last check met, or how long no check has finished."""
        silent = time.monotonic() - self.checked_at
        if silent > STALE_AFTER_S:
            return f"no answer for {silent:.0f} s"
        return self.database


class Health(BaseModel):
    status: Literal["ok", "unhealthy"]
    database: str
    """`ok`, or the kind of error the database check met (or that it has not answered)."""
    backend: str
    rules_version: int | None = None
    failure_agent: Literal["ready", "loading", "on first use", "off"] | None = None


@router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": (
    "The database cannot be reached; `database` names the kind of error.")}})
async def healthz(request: Request) -> JSONResponse:
    """Health of the service and its database (checked every second in the background): 503
    while the database cannot be reached. `rules_version` is the rule set this worker
    answers with. `failure_agent`: `ready`, `loading` (built in the background since start),
    `on first use` or `off`; the service is healthy either way (rules answer meanwhile)."""
    ctx: Context = request.app.state.ctx
    database = request.app.state.health.state()
    if database != "ok":
        return JSONResponse({"status": "unhealthy", "database": database, "backend": ctx.db.backend},
                            status_code=503)
    return JSONResponse({"status": "ok", "database": "ok", "backend": ctx.db.backend,
                         "rules_version": ctx.rulebook.version, "failure_agent": _failure_agent_state(ctx, request)})


def _failure_agent_state(ctx: Context, request: Request) -> str:
    agent = ctx.failure_agent
    if agent is None or not ctx.settings.failure_agent:
        return "off"
    if getattr(agent, "built", False):
        return "ready"
    preload = getattr(request.app.state, "failure_agent_preload", None)
    return "loading" if preload is not None and not preload.done() else "on first use"
