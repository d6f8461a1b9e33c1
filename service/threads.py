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


async def in_turn(slots: asyncio.Semaphore | None, work: Callable[..., T], *args: object) -> T:
    """CPU-bound work (filtering, diagnosing) in a worker thread, at most `slots` at once in
    this process. Threads beyond the cores only contend for the GIL: with 8 uploads filtering
    at once a 2-worker server on 2 cores moved 40-50 MB/s (20 clients, 10 MB logs; upload p99
    7-9 s), with 2 at once 62-78 MB/s (p99 5-6.5 s; bench/load_bench.py, three runs each). A
    waiting upload holds no thread, and a slow client holds no slot while its bytes trickle in."""
    from starlette.concurrency import run_in_threadpool

    if slots is None:
        return await run_in_threadpool(work, *args)
    async with slots:
        return await run_in_threadpool(work, *args)
