"""An append that loses the race for a live job's state (another append moved the version on
first) starts again from the winner's state, with a growing random pause; one that keeps
losing tells the client to retry (503) instead of spinning. On a real database; the race is
made to happen by the state write itself, which is what a concurrent append does to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.context import Context
from service.errors import Busy
from service.live import runs
from service.live.ledger import ChunkRef, checksum
from service.live.notify import Outbox
from service.live.runs import LiveJobs
from service.settings import Settings


@pytest.fixture
def live(tmp_path: Path):
    settings = Settings(data_dir=tmp_path, admin_enabled=False)
    ctx = Context.build(settings)
    yield LiveJobs(ctx, Outbox(settings))
    ctx.close()


def chunk(body: bytes, offset: int = 0) -> ChunkRef:
    return ChunkRef("rank0.log", "", offset, offset + len(body), checksum(body))


def raced(live: LiveJobs) -> float:
    return live.ctx.metrics.live_chunks.labels("raced")._value.get()


def test_a_lost_race_is_tried_again_from_the_winners_state(live: LiveJobs, monkeypatch) -> None:
    job, _ = live.create(name="gpt-1b-race", framework=None, tags=(), external_id=None)
    real = LiveJobs._save_state
    losses = iter([True, True])

    def save(self, session, job_id, version, run) -> None:
        if next(losses, False):
            raise runs._Raced()  # as when another append wrote this version first
        real(self, session, job_id, version, run)

    monkeypatch.setattr(LiveJobs, "_save_state", save)
    body = b"step 1 loss 2.5\nstep 2 loss 2.4\n"
    ack = live.append(job.id, chunk(body), body)
    assert (ack["lines"], ack["lines_received"], ack["duplicate"]) == (2, 2, False)
    assert raced(live) == 2


def test_an_append_that_always_loses_is_told_to_retry(live: LiveJobs, monkeypatch) -> None:
    job, _ = live.create(name="gpt-1b-race", framework=None, tags=(), external_id=None)

    def save(self, session, job_id, version, run) -> None:
        raise runs._Raced()

    monkeypatch.setattr(LiveJobs, "_save_state", save)
    monkeypatch.setattr(runs, "MAX_ATTEMPTS", 3)
    body = b"step 1 loss 2.5\n"
    with pytest.raises(Busy, match="retry"):
        live.append(job.id, chunk(body), body)
    assert raced(live) == 3
    monkeypatch.undo()
    assert live.append(job.id, chunk(body), body)["lines_received"] == 1  # nothing of the lost ones was kept
