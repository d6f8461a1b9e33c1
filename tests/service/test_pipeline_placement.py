"""Under torchrun --tee a line names its rank but not its node; the failure box does."""

from __future__ import annotations

from service.pipeline import JobRun
from service.rulebook import Rulebook

BOX = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "pretrain_gpt.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2025-03-14_09:15:01",
    "  host      : dgx-042",
    "  rank      : 12 (local_rank: 4)",
    "  exitcode  : -6 (pid: 3139623)",
    "  error_file: <N/A>",
    "  traceback : Signal 6 (SIGABRT) received by PID 3139623",
    "============================================================",
]


def test_the_failure_box_gives_the_node_of_the_rank_that_failed() -> None:
    run = JobRun(Rulebook())
    lines = ["[default4]:[rank12]:[E314 09:15:00.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 12] "
             "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered",
             *BOX]
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.reason == "ecc_error"
    assert (diagnosis.root_cause.rank, diagnosis.root_cause.node) == (12, "dgx-042")
    assert diagnosis.suspect_nodes == ["dgx-042"]
    assert "dgx-042" in diagnosis.mitigation


def test_a_box_of_another_rank_names_no_node_for_this_one() -> None:
    run = JobRun(Rulebook())
    lines = ["[default1]:[rank9]:[E314 09:15:00.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 9] "
             "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered",
             *BOX]
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.rank == 9 and diagnosis.root_cause.node is None
