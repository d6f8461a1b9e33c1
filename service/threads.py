"""Blocking work from the event loop that is never left running behind a cancelled task."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_thread(work: Callable[..., T], *args: object) -> T:
    """asyncio.to_thread, except that cancelling the caller waits for the thread to finish.

    A thread cannot be interrupted: with plain to_thread a background round cancelled at
    shutdown went on using the database after the service had closed it, and its connection
    came back to a disposed pool, never to be closed (a psycopg ResourceWarning at exit).
    """
    job = asyncio.ensure_future(asyncio.to_thread(work, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job])
        raise
