"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from service.deps import ContextDep

router = APIRouter()


@router.get("/healthz")
def healthz(ctx: ContextDep) -> JSONResponse:
    """Health of the service and its database: 503 while the database cannot be reached."""
    try:
        with ctx.db.session() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        return JSONResponse({"status": "unhealthy", "database": type(exc).__name__,
                             "backend": ctx.db.backend}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok", "backend": ctx.db.backend,
                         "rules_version": ctx.rulebook.version})
