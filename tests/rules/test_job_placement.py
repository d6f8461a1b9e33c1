"""Under torchrun --tee a line names its rank but not its node; the failure box does."""

from __future__ import annotations

import pytest

from rules.job import JobRun

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


def test_the_failure_box_gives_the_node_of_the_rank_that_failed(builtin_rulebook) -> None:
    run = JobRun(builtin_rulebook)
    lines = ["[default4]:[rank12]:[E314 09:15:00.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 12] "
             "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered",
             *BOX]
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.reason == "ecc_error"
    assert (diagnosis.root_cause.rank, diagnosis.root_cause.node) == (12, "dgx-042")
    assert diagnosis.suspect_nodes == ["dgx-042"]
    assert "dgx-042" in diagnosis.mitigation


def test_a_box_of_another_rank_names_no_node_for_this_one(builtin_rulebook) -> None:
    run = JobRun(builtin_rulebook)
    lines = ["[default1]:[rank9]:[E314 09:15:00.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 9] "
             "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered",
             *BOX]
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.rank == 9 and diagnosis.root_cause.node is None


def _ib_failure(node: int) -> str:
    host = f"gpu-{node:03d}"
    return (f"{host}: {host}:{3100 + node}:{3400 + node} [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion "
            f"from peer 10.12.0.{node}<44206> with status=12 opcode=129 len=65536 vendor err 129 (Recv) "
            "localGid ::ffff:29.87.88.182 remoteGids::ffff:29.87.4.221")


def test_one_node_with_a_fabric_error_is_cordoned(builtin_rulebook) -> None:
    run = JobRun(builtin_rulebook)
    run.feed("job.log", (_ib_failure(7) + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.reason == "network_error"
    assert diagnosis.suspect_nodes == ["gpu-007"] and diagnosis.action == "cordon_and_restart"


def test_the_same_fabric_error_from_many_nodes_cordons_none_of_them(builtin_rulebook) -> None:
    # twelve nodes losing their links at once is the switch or the fabric, not twelve bad nodes
    run = JobRun(builtin_rulebook)
    run.feed("job.log", ("\n".join(_ib_failure(n) for n in range(1, 13)) + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.reason == "network_error"
    assert diagnosis.suspect_nodes == [] and diagnosis.action == "investigate"
    assert "12 or more nodes" in diagnosis.mitigation


def test_files_named_for_ranks_are_not_nodes(builtin_rulebook) -> None:
    """`faultline tail ... 'logs/rank*.log'`: the node is the one NCCL's own prefix names, not
    `rank2`; files named like hosts still stand for their node."""
    run = JobRun(builtin_rulebook)
    run.feed("logs/rank0.log", b"step 1 ok\n")
    run.feed("logs/rank2.log", (_ib_failure(29).split(": ", 1)[1] + "\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.reason == "network_error"
    assert diagnosis.suspect_nodes == ["gpu-029"] and diagnosis.root_cause.node == "gpu-029"
    hosts = JobRun(builtin_rulebook)
    hosts.feed("logs/a100-028.log", b"step 1 ok\n")
    hosts.feed("logs/a100-029.log", b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    assert hosts.finish().suspect_nodes == ["a100-029"]


def test_a_cuda_kernel_failure_alone_is_a_restart_not_a_cordon(builtin_rulebook) -> None:
    """An illegal memory access is most often the model's own out-of-bounds access: with no
    Xid, ECC or NVLink line beside it, no node is drained for it, even one the line names."""
    run = JobRun(builtin_rulebook)
    run.feed("job.log", (
        "[default3]:[rank11]:[E314 09:15:00.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 11] "
        "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
        "h100-025:3139:3201 [3] NCCL INFO [Service thread] Connection closed by localRank 3\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.reason == "cuda_error"
    assert diagnosis.action == "restart" and diagnosis.suspect_nodes == []


def test_a_cuda_kernel_failure_beside_an_xid_of_its_node_is_a_cordon(builtin_rulebook) -> None:
    run = JobRun(builtin_rulebook)
    run.feed("job.log", (
        "h100-025: [Tue Mar 14 09:14:58 2025] NVRM: Xid (PCI:0000:9b:00): 79, pid=3139, GPU has fallen off the bus.\n"
        "[default3]:[rank11]:[E314 09:15:00.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 11] "
        "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
        ).encode())
    diagnosis = run.finish()
    assert diagnosis.action == "cordon_and_restart" and diagnosis.suspect_nodes == ["h100-025"]


def test_a_one_node_jobs_banner_names_its_node(builtin_rulebook) -> None:
    run = JobRun(builtin_rulebook)
    run.feed("slurm-4242.out", b"SLURM_JOB_NODELIST=a100-031\nstep 1 ok\n"
             b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    assert run.finish().suspect_nodes == ["a100-031"]
    many = JobRun(builtin_rulebook)  # a range names no one node
    many.feed("slurm-4243.out", b"SLURM_JOB_NODELIST=a100-[031-034]\n"
              b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    assert many.finish().suspect_nodes == []


def test_a_configured_pattern_decides_which_files_are_nodes(builtin_rulebook) -> None:
    ecc = b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    run = JobRun(builtin_rulebook, node_files=r"node_(?P<node>\d+)\.log$")
    run.feed("logs/node_07.log", b"step 1 ok\n")
    run.feed("logs/node_12.log", ecc)
    assert run.finish().suspect_nodes == ["12"]
    hosts = JobRun(builtin_rulebook, node_files=r"^nodes/(?P<node>[\w-]+)\.log$")  # host-like names outside it are not
    hosts.feed("logs/a100-028.log", b"step 1 ok\n")
    hosts.feed("logs/a100-029.log", ecc)
    assert hosts.finish().suspect_nodes == []


@pytest.mark.parametrize(("pattern", "message"), [
    (r"gpu-\d+\.log", "needs a group named node"),
    (r"(?P<node>(a+)+\1)", "FAULTLINE_NODE_FILE_PATTERN"),
])
def test_a_bad_node_file_pattern_is_refused_by_its_setting(tmp_path, pattern: str, message: str) -> None:
    from service.settings import Settings

    with pytest.raises(ValueError, match=message):
        Settings(data_dir=tmp_path, node_file_pattern=pattern)


@pytest.mark.parametrize("message", [
    "ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.12.0.7<44206> with status=12 opcode=129",
    "transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'",
    "misc/ibvwrap.cc:284 NCCL WARN Call to ibv_modify_qp failed with error Invalid argument",
    "NCCL WARN Call to ibv_modify_qp failed with error Invalid argument",
])
def test_nccls_own_prefix_names_the_node_whatever_source_file_it_cites(builtin_rulebook, message: str) -> None:
    """Newer NCCL puts the source location before the level: a path for its own files."""
    run = JobRun(builtin_rulebook)
    line = f"node23:12098:12141 [2] {message}"
    run.feed("job.log", (line + "\n" + "node23:12098:12141 [2] NCCL INFO init.cc:1196 -> 1\n").encode())
    diagnosis = run.finish()
    assert diagnosis.root_cause.line == line and diagnosis.root_cause.node == "node23"
