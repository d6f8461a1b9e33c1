"""A job someone stopped with Ctrl+C before any training step, with no error of its own: it
sat still at the line before the interrupt (rules/interrupt.py, rules.verdict.decide)."""

from __future__ import annotations

import pytest

from rules.interrupt import is_interrupt, line_before
from rules.job import JobRun
from rules.rulebook import Rulebook

SETUP = [
    "using world size: 8, data-parallel-size: 8, tensor-model-parallel size: 1, pipeline-model-parallel size: 1",
    "using torch.float16 for parameters ...",
    "> compiling and loading fused kernels ...",
]


def _diagnose(rulebook: Rulebook, lines: list[str]):
    run = JobRun(rulebook)
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    return run.finish()


@pytest.mark.parametrize("line", [
    "^CTraceback (most recent call last):", "^C", "KeyboardInterrupt",
    "WARNING:torch.distributed.elastic.agent.server.api:Received 2 death signal, shutting down workers",
    "W0227 17:39:41.936000 293817 api.py:719] Received Signals.SIGINT death signal, shutting down workers",
])
def test_the_marks_of_ctrl_c(line: str) -> None:
    assert is_interrupt(line)


@pytest.mark.parametrize("line", [
    "W0227 17:39:41.936000 293817 api.py:719] Received 15 death signal, shutting down workers",
    "pattern [^C] matched", "Sending process 4797 closing signal SIGINT",
])
def test_what_is_not_ctrl_c(line: str) -> None:
    assert not is_interrupt(line)


def test_the_line_before_skips_blank_lines() -> None:
    assert line_before(b"a\nb\n\n\n^C\n", 4) == (b"b", 1)
    assert line_before(b"^C\n", 0) is None


@pytest.mark.parametrize("interrupt", [
    ["^CTraceback (most recent call last):", '  File "pretrain_gpt.py", line 149, in <module>'],
    ["", "WARNING:torch.distributed.elastic.agent.server.api:Received 2 death signal, shutting down workers",
     "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 4797 closing signal SIGINT"],
])
def test_a_job_interrupted_before_training_sat_at_the_line_before(builtin_rulebook: Rulebook, interrupt) -> None:
    d = _diagnose(builtin_rulebook, [*SETUP, *interrupt])
    assert d.status == "stalled" and d.action == "investigate"
    assert d.root_cause.reason == "hang" and d.root_cause.line_number == 3
    assert d.root_cause.line == SETUP[-1]
    assert "Ctrl+C" in d.mitigation


def test_a_sigterm_is_a_cancellation_not_an_interrupt(builtin_rulebook: Rulebook) -> None:
    d = _diagnose(builtin_rulebook, [*SETUP, "W0227 17:39:41.936000 293817 api.py:719] Received 15 death signal, "
                                             "shutting down workers"])
    assert d.root_cause.reason == "job_cancelled"


def test_an_error_before_the_interrupt_stays_the_cause(builtin_rulebook: Rulebook) -> None:
    d = _diagnose(builtin_rulebook, [*SETUP, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                                     "^CTraceback (most recent call last):"])
    assert d.root_cause.reason == "out_of_memory"


def test_an_interrupt_that_opens_a_buffer_sat_at_the_previous_buffers_last_line(builtin_rulebook: Rulebook) -> None:
    run = JobRun(builtin_rulebook)
    run.feed("job.log", ("\n".join(SETUP) + "\n\n").encode())
    run.feed("job.log", b"^CTraceback (most recent call last):\n")
    d = run.finish()
    assert d.status == "stalled" and d.root_cause.line == SETUP[-1] and d.root_cause.line_number == 3
