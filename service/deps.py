"""Request dependencies as Annotated aliases, so routes read like typed functions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.access import require
from service.context import Context
from service.live.runs import LiveJobs

MAX_OFFSET = 2**62
"""Upper bound of offset-like query parameters: past any real file or row count, and inside
a 64-bit database integer (a larger one made SQLite raise instead of answering 422)."""


def get_context(request: Request) -> Context:
    return request.app.state.ctx


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.ctx.db.session() as session:
        yield session


def get_live(request: Request) -> LiveJobs:
    return request.app.state.live


ContextDep = Annotated[Context, Depends(get_context)]
LiveDep = Annotated[LiveJobs, Depends(get_live)]
SessionDep = Annotated[Session, Depends(get_session)]

INGEST = Depends(require("ingest"))
"""On routes that create jobs or add to them: a token with the `ingest` scope, when tokens are configured."""
READ = Depends(require("read"))
"""On routes that read jobs, their diagnoses and lines: a token with the `read` scope."""
SOURCES = Depends(require("read", "ingest"))
"""What a live job holds of each file: the sidecar resumes from it with its `ingest` token."""
