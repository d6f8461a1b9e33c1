"""in_thread(): a cancelled background round does not outlive its task (the database it uses
is closed right after the tasks are cancelled, at shutdown)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.threads import in_thread


def test_cancelling_the_caller_waits_for_the_thread_to_finish() -> None:
    started, finished = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    async def main() -> None:
        task = asyncio.create_task(in_thread(work))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished.is_set(), "the thread was still running when the task ended"

    asyncio.run(main())


def test_the_result_and_the_error_of_the_work_come_back() -> None:
    def fail() -> None:
        raise ValueError("database hiccup")

    async def main() -> None:
        assert await in_thread(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ValueError, match="hiccup"):
            await in_thread(fail)

    asyncio.run(main())
