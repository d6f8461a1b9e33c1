"""The FastAPI application: create_app(settings) builds everything in its lifespan."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service.access import ApiTokens
from service.admin.auth import AdminTokens
from service.context import Context
from service.errors import FaultlineError
from service.live.runs import LiveJobs
from service.metrics import LatencyMiddleware, Metrics
from service.live.notify import Deliverer, Outbox
from service.admin import api as admin
from service.admin import web as admin_web
from service.api import diagnose
from service.api import health
from service.api import jobs
from service.api import metrics
from service.api import shippers
from service.settings import Settings, load_settings
from service.threads import in_thread

log = logging.getLogger(__name__)


async def _every(seconds: float, work: Callable[[], object]) -> None:
    """Run blocking work in a thread every `seconds` until cancelled; a failed round is logged
    (a database that is down in one line: /healthz already says so, the next round retries)."""
    name = getattr(work, "__name__", "work")
    while True:
        await asyncio.sleep(seconds)
        try:
            await in_thread(work)
        except (OperationalError, PoolTimeout) as exc:
            log.warning("periodic %s skipped: database unavailable (%s)", name, type(exc).__name__)
        except Exception:
            log.exception("periodic %s failed", name)


DATABASE_RETRY_AFTER_S = 2


def _error(status: int, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"error": message, "status": status, **extra}, status_code=status)


def _log_to_stderr() -> None:
    """The service's own INFO lines (one per diagnosis, webhook deliveries) beside uvicorn's:
    uvicorn configures only its own loggers, and each worker process builds its app here."""
    ours = logging.getLogger("faultline")
    if not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)


PRELOAD_STOP_WAIT_S = 3.0
"""At shutdown, how long to wait for the Failure Agent's build to stop: it stops between two
batches of embeddings, but loading the model (12 s on this 2-core machine) cannot be
interrupted, and a container's grace period is often 10 s. A batch of embeddings takes
about 2.5 s here."""


class _Preload(threading.Thread):
    """The Failure Agent's build at start, in a daemon thread: a shutdown waits for it at most
    PRELOAD_STOP_WAIT_S (a daemon thread ends with the process; a thread of asyncio's
    executor would be joined at exit, however long the model load still takes)."""

    def __init__(self, agent: object):
        super().__init__(name="failure-agent-preload", daemon=True)
        self.failure_agent = agent

    def run(self) -> None:
        from agents.knowledge import Stopped

        try:
            self.failure_agent.agent()
        except Stopped:
            pass
        except Exception as exc:  # noqa: BLE001 - the first log that needs the agent builds it again, and says why
            log.warning("the Failure Agent could not be preloaded: %s", exc)

    def done(self) -> bool:
        return not self.is_alive()


def create_app(settings: Settings | None = None, *, embedder: object | None = None) -> FastAPI:
    """The app; raises ConfigError (refuses to start) with admin enabled and no real token.
    `embedder`: a loaded embedding model to share (tests); by default the Failure Agent
    loads its own on first use."""
    settings = settings or load_settings()
    settings.require_admin_token()
    _log_to_stderr()
    registry = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = Context.build(settings, metrics=registry, embedder=embedder)
        app.state.ctx = ctx
        outbox = Outbox(settings)
        outbox.attach(asyncio.get_running_loop())
        app.state.live = live = LiveJobs(ctx, outbox)
        app.state.health = probe = health.HealthProbe()
        await in_thread(probe.check, ctx)  # /healthz answers from the first request on

        def check_health() -> None:
            probe.check(ctx)

        tasks = [asyncio.create_task(_every(settings.hang_check_interval_s, live.sweep), name="stall-sweep"),
                 asyncio.create_task(_every(health.PROBE_INTERVAL_S, check_health), name="health-probe")]
        warming = None
        if ctx.failure_agent is not None and settings.preload_failure_agent:
            # in a thread: the model's load is CPU work; a request that needs the agent
            # meanwhile waits for the same build (LazyFailureAgent's lock), never a second one
            warming = _Preload(ctx.failure_agent)
            warming.start()
            app.state.failure_agent_preload = warming
        if outbox.enabled:
            deliverer = Deliverer(settings, ctx.db, registry)
            tasks.append(asyncio.create_task(deliverer.run(outbox.wake), name="webhook-delivery"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if warming is not None:
                # a thread cannot be cancelled: the build stops at its next batch of embeddings
                # (a slow machine took longer than a container's grace period to finish it)
                ctx.failure_agent.stopping.set()
                await asyncio.to_thread(warming.join, PRELOAD_STOP_WAIT_S)
            ctx.close()

    # /docs (Swagger UI) and /redoc from the files fastapi-offline ships: FastAPI's own pages
    # load them from a CDN, and a service inside a cluster often has no way out
    app = FastAPIOffline(title="Faultline", version="0.1.0", lifespan=lifespan,
                         description="Diagnoses why a large-model training job failed, from its logs.")
    app.state.metrics = registry
    app.state.upload_slots = asyncio.Semaphore(settings.max_concurrent_uploads)
    app.state.cpu_slots = asyncio.Semaphore(settings.max_parallel_diagnoses)
    app.state.admin_tokens = AdminTokens.from_settings(settings)
    app.state.api_tokens = ApiTokens.from_settings(settings)
    app.add_middleware(LatencyMiddleware, metrics=registry)

    @app.exception_handler(FaultlineError)
    async def _faultline_error(_request: Request, exc: FaultlineError) -> JSONResponse:
        response = _error(exc.status_code, str(exc), **exc.extra)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeout)
    async def _database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # the database is down or restarting: nothing was acknowledged, the client may retry
        # (with the same Idempotency-Key, a retry never stores a second copy)
        response = _error(503, f"database unavailable ({type(exc).__name__}): retry later")
        response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
        return response

    @app.exception_handler(DataError)
    async def _unstorable_value(_request: Request, exc: DataError) -> JSONResponse:
        # a value the database refuses (PostgreSQL: a NUL character in text) is the caller's
        # input; the message names the problem, never the statement or its parameters
        problem = str(exc.orig).splitlines()[0][:200] if exc.orig is not None else type(exc).__name__
        return _error(422, f"a value in the request cannot be stored: {problem}")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return _error(422, "; ".join(problems) or "invalid request")

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _exc: ClientDisconnect) -> Response:
        # the client went away before its body ended or before the answer: nothing was
        # acknowledged or stored (the job's transaction never began), and no one is left to
        # read an answer
        logging.getLogger("faultline.requests").info(
            "request abandoned by its client, nothing stored: %s %s", request.method, request.url.path)
        return Response(status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    for module in (health, diagnose, jobs, shippers, metrics, admin, admin_web):
        app.include_router(module.router)
    return app
