"""Origin from evidence: a connection failure or an NCCL timeout before any training step is
the job's setup (user); after training steps the rule's infrastructure origin stands."""

from __future__ import annotations

import pytest

from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook

STEPS = [
    f" iteration      {n}/  500000 | consumed samples:       {n * 128} | elapsed time per iteration (ms): 1234.5 | "
    f"learning rate: 1.500E-04 | global batch size:   128 | lm loss: 2.{n:06d}E+00 | loss scale: 65536.0 | "
    "grad norm: 0.512 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    for n in range(100, 110)
]
FAILURES = {
    "connection_error": "torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying "
                        "to connect to (node-001, 29500).",
    "nccl_timeout": "[rank3]:[E1128 21:12:50.390000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
                    "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                    "ran for 600012 milliseconds before timing out.",
}


def diagnose(rulebook: Rulebook, lines: list[str]):
    run = JobRun(rulebook, JobMeta(name="gpt-7b"))
    run.feed("train.log", ("\n".join(lines) + "\n").encode())
    return run.finish()


@pytest.mark.parametrize("reason", sorted(FAILURES))
def test_before_the_first_step_it_is_the_setup(builtin_rulebook: Rulebook, reason: str) -> None:
    d = diagnose(builtin_rulebook, ["starting", FAILURES[reason]])
    assert d.root_cause.reason == reason
    assert d.root_cause.origin == "user" and d.action == "fix_and_resubmit" and d.suspect_nodes == []
    assert d.mitigation.startswith("No training step was logged before it")


@pytest.mark.parametrize("reason", sorted(FAILURES))
def test_after_training_steps_the_rule_origin_stands(builtin_rulebook: Rulebook, reason: str) -> None:
    d = diagnose(builtin_rulebook, [*STEPS, FAILURES[reason]])
    assert d.root_cause.reason == reason
    assert d.root_cause.origin == "infrastructure" and d.action != "fix_and_resubmit"
