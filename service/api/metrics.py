"""GET /metrics: Prometheus text format, from the app's own registry."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.admin.review import status_counts

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Counters, the request latency histogram and the stored rules by kind and status."""
    ctx = request.app.state.ctx
    registry = request.app.state.metrics

    def counts() -> dict:
        with ctx.db.session() as session:
            return status_counts(session)

    registry.set_rule_counts(await run_in_threadpool(counts))
    return Response(registry.render(), media_type=registry.content_type)
