"""The FastAPI application: create_app(settings) builds everything in its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.auth import AdminTokens
from service.context import Context
from service.errors import FaultlineError
from service.metrics import LatencyMiddleware, Metrics
from service.routes import admin, admin_web, diagnose, health, jobs, metrics
from service.settings import Settings, load_settings


def _error(status: int, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"error": message, "status": status, **extra}, status_code=status)


def create_app(settings: Settings | None = None, *, embedder: object | None = None) -> FastAPI:
    """The app; raises ConfigError (refuses to start) with admin enabled and no real token.
    `embedder`: a loaded embedding model to share (tests); by default the Failure Agent
    loads its own on first use."""
    settings = settings or load_settings()
    settings.require_admin_token()
    registry = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = Context.build(settings, metrics=registry, embedder=embedder)
        app.state.ctx = ctx
        try:
            yield
        finally:
            ctx.close()

    app = FastAPI(title="Faultline", version="0.1.0", lifespan=lifespan,
                  description="Diagnoses why a large-model training job failed, from its logs.")
    app.state.metrics = registry
    app.state.admin_tokens = AdminTokens.from_settings(settings)
    app.add_middleware(LatencyMiddleware, metrics=registry)

    @app.exception_handler(FaultlineError)
    async def _faultline_error(_request: Request, exc: FaultlineError) -> JSONResponse:
        response = _error(exc.status_code, str(exc), **exc.extra)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return _error(422, "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    for module in (health, diagnose, jobs, metrics, admin, admin_web):
        app.include_router(module.router)
    return app
