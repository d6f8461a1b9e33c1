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


def test_a_timeout_thousands_of_collectives_in_is_past_the_setup(builtin_rulebook: Rulebook) -> None:
    """A paste with no training step, but the watchdog's sequence number says twelve million
    collectives ran before the one that timed out: not the job's setup."""
    late = FAILURES["nccl_timeout"].replace("SeqNum=7,", "SeqNum=12029440,")
    d = diagnose(builtin_rulebook, ["[Torch] Checkpoint global_step5000 is ready now!", late])
    assert (d.root_cause.reason, d.root_cause.origin) == ("nccl_timeout", "infrastructure")
    assert not d.mitigation.startswith("No training step was logged before it")


def _torchrun_box(signal: int, name: str, pids: list[int]) -> list[str]:
    def entry(i: int, pid: int) -> list[str]:
        return [f"[{i}]:", "  time      : 2024-01-16_18:04:01", "  host      : node-1",
                f"  rank      : {i} (local_rank: {i})", f"  exitcode  : -{signal} (pid: {pid})",
                "  error_file: <N/A>", f"  traceback : Signal {signal} ({name}) received by PID {pid}"]
    return ["============================================================", "train.py FAILED",
            "------------------------------------------------------------", "Failures:",
            *[line for i, pid in enumerate(pids[1:], 1) for line in entry(i, pid)],
            "------------------------------------------------------------", "Root Cause (first observed failure):",
            *entry(0, pids[0]), "============================================================"]


def test_ranks_killed_by_sigbus_with_no_exception_ran_out_of_shared_memory(builtin_rulebook: Rulebook) -> None:
    """Evidence, not a rule's words: SIGBUS and no exception of the job's own is /dev/shm full
    (pytorch#5247); the line named is the one torchrun calls the root cause, not the first
    rank listed above it."""
    d = diagnose(builtin_rulebook, [*STEPS, *_torchrun_box(7, "SIGBUS", [16609, 16614, 16615])])
    assert (d.root_cause.reason, d.root_cause.origin, d.action) == ("out_of_memory", "user", "fix_and_resubmit")
    assert d.root_cause.line == "  traceback : Signal 7 (SIGBUS) received by PID 16609"
    assert "/dev/shm" in d.mitigation


def test_sigkill_names_the_root_cause_section_of_the_box_too(builtin_rulebook: Rulebook) -> None:
    d = diagnose(builtin_rulebook, [*STEPS, *_torchrun_box(9, "SIGKILL", [2201, 2202, 2203])])
    assert (d.root_cause.reason, d.root_cause.origin) == ("out_of_memory", "user")
    assert d.root_cause.line == "  traceback : Signal 9 (SIGKILL) received by PID 2201"
