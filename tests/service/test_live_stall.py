"""Stalls of live jobs, judged by the clock: the service's own LiveJobs on a real database,
with a clock the test moves (no sleeping, no timing assertions). The adaptive threshold:
the floor, k times the time between progress reports, 1.5 times a pause the job survived,
twice the floor before the first step; noise without progress is still a stall; progress
after a stall makes the job running again; a stalled job killed later died of the hang."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from service.app import _every
from service.context import Context
from service.live.ledger import ChunkRef, checksum
from service.live.runs import LiveJobs
from service.store.models import Job
from service.live.notify import Outbox
from service.settings import Settings
from tests.service.test_live_api import iteration

FLOOR = 60.0
WARNING = ("[lrdn3321:0]:/opt/megatron/megatron/core/tensor_parallel/layers.py:609: UserWarning: When using async "
           "grad allreduce it is recommended to set the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1 for "
           "maximum speedup")


class Clock:
    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now


class LiveJob:
    def __init__(self, live: LiveJobs, clock: Clock):
        self.live, self.clock = live, clock
        self.id = live.create(name="gpt-7b-pretrain", framework=None, tags=(), external_id=None)[0].id
        self.offset = 0

    def send(self, lines: list[str]) -> None:
        body = ("\n".join(lines) + "\n").encode()
        self.live.append(self.id, ChunkRef("rank7.log", "f", self.offset, self.offset + len(body), checksum(body)), body)
        self.offset += len(body)

    def after(self, seconds: float) -> str:
        """Move the clock, let a GET (or the sweep) look, return the stored status."""
        self.clock.now += seconds
        self.live.check_stall(self.id)
        return self.view().status

    def view(self) -> Job:
        with self.live.ctx.db.session() as session:
            return session.get(Job, self.id)


@pytest.fixture
def live(tmp_path: Path) -> tuple[LiveJobs, Clock]:
    settings = Settings(data_dir=tmp_path, admin_enabled=False, log_agent=False, hang_floor_s=FLOOR,
                        hang_step_factor=20.0)
    ctx = Context.build(settings)
    clock = Clock()
    yield LiveJobs(ctx, Outbox(settings), clock=clock), clock
    ctx.close()


def test_silence_past_the_floor_is_a_stall_with_the_last_step_as_its_line(live) -> None:
    job = LiveJob(*live)
    job.send([iteration(s, 2.3, ms=1552.8) for s in range(1, 41)])  # 20 x 1.55 s = 31 s < the floor
    assert job.after(FLOOR - 1) == "running"
    assert job.after(2) == "stalled"
    diagnosis = job.view().diagnosis
    assert diagnosis["root_cause"]["reason"] == "hang" and diagnosis["action"] == "restart"
    assert diagnosis["root_cause"]["line"] == iteration(40, 2.3, ms=1552.8)
    assert diagnosis["stall"] == {"silent_s": FLOOR + 1, "threshold_s": FLOOR, "since": "progress"}
    assert "No training progress for 61 seconds" in diagnosis["mitigation"]
    job.send([iteration(41, 2.3)])
    assert job.view().status == "running", "progress again: the stall is over"


def test_the_threshold_counts_the_steps_between_reports(live) -> None:
    job = LiveJob(*live)
    # --log-interval 50 at 1.55 s a step: a report every 77.6 s, so 20 reports' worth is 1553 s
    job.send([iteration(s, 2.3) for s in range(50, 2001, 50)])
    assert job.after(1500) == "running"
    assert job.after(60) == "stalled"
    assert job.view().diagnosis["stall"]["threshold_s"] == pytest.approx(20 * 50 * 1.5528, abs=0.01)


def test_a_pause_the_job_survived_raises_the_threshold(live) -> None:
    job = LiveJob(*live)
    job.send([iteration(s, 2.3) for s in range(1, 101)])
    job.clock.now += 900  # a 15-minute evaluation, then training goes on
    job.send([iteration(s, 2.3) for s in range(101, 111)])
    assert job.after(1300) == "running", "1.5 x 900 s = 1350 s: an evaluation is not a hang"
    assert job.after(60) == "stalled"


def test_startup_gets_twice_the_floor_and_counts_output(live) -> None:
    job = LiveJob(*live)
    job.send(["> compiling and loading fused kernels ..."])
    assert job.after(2 * FLOOR - 1) == "running"
    assert job.after(2) == "stalled"
    diagnosis = job.view().diagnosis
    assert diagnosis["stall"]["since"] == "output"
    assert diagnosis["root_cause"]["line"] == "> compiling and loading fused kernels ..."
    assert "No output and no training step yet" in diagnosis["mitigation"]


def test_noise_without_progress_is_still_a_stall(live) -> None:
    job = LiveJob(*live)
    job.send([iteration(s, 2.3) for s in range(1, 21)])
    for _ in range(3):
        job.clock.now += 30
        job.send([WARNING])  # output goes on, steps do not
    assert job.view().status == "stalled", "the append itself saw 90 s without a step"


def test_a_stalled_job_killed_later_died_of_the_hang(live) -> None:
    job = LiveJob(*live)
    job.send([iteration(s, 2.3) for s in range(1, 21)])
    assert job.after(FLOOR + 5) == "stalled"
    final = job.live.finish(job.id, 143)  # scancel after the hang
    assert final.status == "failed" and final.diagnosis["root_cause"]["reason"] == "hang"
    assert final.diagnosis["stall"]["since"] == "progress"


def test_the_sweep_finds_silent_jobs_and_leaves_busy_ones(live) -> None:
    live_jobs, clock = live
    quiet, busy = LiveJob(live_jobs, clock), LiveJob(live_jobs, clock)
    quiet.send([iteration(s, 2.3) for s in range(1, 11)])
    clock.now += FLOOR + 1
    busy.send([iteration(s, 2.3) for s in range(1, 11)])
    assert live_jobs.sweep() == 1
    assert quiet.view().status == "stalled" and busy.view().status == "running"
    assert live_jobs.sweep() == 0, "marked once"


def test_a_sweep_while_the_database_is_down_is_one_warning_not_a_traceback(caplog) -> None:
    failures = [OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused")), ValueError("a bug")]

    def sweep() -> None:
        if failures:
            raise failures.pop(0)

    def logged() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "service.app"]

    async def rounds() -> None:
        task = asyncio.create_task(_every(0, sweep))
        while len(logged()) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="service.app"):
        asyncio.run(rounds())
    down, bug = logged()
    assert down.levelno == logging.WARNING and down.exc_info is None
    assert down.getMessage() == "periodic sweep skipped: database unavailable (OperationalError)"
    assert bug.levelno == logging.ERROR and bug.exc_info is not None, "any other failure keeps its traceback"
