"""Multi-error logs built from real error texts (public issue threads, cited per case).

Hosts, pids and timestamps are this test's own; the wordings are what PyTorch, NCCL, CUDA
and Slurm print. In each, the first and the last error line are not the root cause.
"""

from __future__ import annotations

import pytest

from rules.classifier import Classifier, DiagnosisProgram
from rules.model import KeptLine
from rules.builtin import builtin_diagnosis_rules
from rules.rootcause import choose_root_cause

PROGRAM = DiagnosisProgram(builtin_diagnosis_rules())


def timeouts(ranks, stamp="E626 06:24:44"):
    return [f"[rank{r}]:[{stamp}.9038{r}1913 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 6000{r}0 milliseconds before timing out."
            for r in ranks]


BOX = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "pretrain_gpt.py FAILED",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2025-06-26_06:24:46",
    "  host      : gpu-041",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : -6 (pid: 1886322)",
    "  traceback : Signal 6 (SIGABRT) received by PID 1886322",
]

CASES = {
    # vllm-project/vllm#6042: "one process has illegal memory access. It dies, but the rest
    # process is still in allreduce"
    "illegal-memory-access": (
        [*timeouts([1]),
         "[rank3]:[E626 06:24:40.112358013 ProcessGroupNCCL.cpp:1414] [PG 2 Rank 3] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
         "[rank3]:CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
         *timeouts([0, 2, 4, 5, 6, 7]),
         "[rank0]:[E626 06:24:44.531176265 ProcessGroupNCCL.cpp:684] [Rank 0] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
         *BOX],
        "cuda_error", 2),
    # NVIDIA/nccl#1814 (status=12 then flushed status=5) and nccl#2076 (ncclRemoteError on survivors)
    "ib-link": (
        ["[rank5]:[E1103 02:11:07.440238649 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 5]  failure detected by watchdog at work sequence id: 120049 PG status: last enqueued work: 120051, last completed work: 120048",
         "hgx-012:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 172.36.143.59<44206> with status=12 opcode=129 len=65536 vendor err 129 (Recv) localGid ::ffff:29.87.88.182 remoteGids::ffff:29.87.4.221",
         "hgx-012:984:1357 [4] NCCL INFO transport/net.cc:1298 -> 6",
         "hgx-012:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 172.36.143.59<44206> with status=5 opcode=129 len=0 vendor err 249 (Recv) localGid ::ffff:29.87.88.182 remoteGids::ffff:29.87.4.221",
         "[rank4]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5",
         "[rank4]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
         *BOX],
        "network_error", 2),
    # murong-xu/CADS#4 (OOM text); the timeouts and the box follow on the survivors
    "oom-on-one-rank": (
        [*timeouts([2]),
         "[rank6]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 6 has a total capacity of 79.15 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 66.41 GiB memory in use.",
         *timeouts([0, 1, 3, 4, 5, 7]),
         *BOX],
        "out_of_memory", 2),
    # alibaba/Pai-Megatron-Patch#583: a DataLoader worker killed, then SIGTERM to the rest
    "dataloader-killed": (
        ["[rank0]:[before the start of training step] datetime: 2025-05-06 12:45:42 ",
         "[rank0]: Traceback (most recent call last):",
         "[rank0]:   File \"/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py\", line 1133, in _try_get_data",
         "[rank0]:     data = self._data_queue.get(timeout=timeout)",
         "[rank0]: RuntimeError: DataLoader worker (pid 9382) is killed by signal: Killed.",
         "W0506 12:45:50.120000 3311 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 3402 closing signal SIGTERM",
         *BOX],
        "dataloader_killed", 5),
    # ZettaAI/zetta_utils#671: the time limit, then the survivors' teardown
    "time-limit": (
        ["srun: Job step aborted: Waiting up to 47 seconds for job step to finish.",
         "slurmstepd: error: *** JOB 494583 ON gpu-041 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
         "W0420 09:09:37.936000 293817 site-packages/torch/distributed/elastic/agent/server/api.py:719] Received 15 death signal, shutting down workers",
         "torch.distributed.elastic.multiprocessing.api.SignalException: Process 293817 got signal: 15"],
        "job_cancelled", 2),
    # pytorch/pytorch#107021: the store is unreachable; ChildFailedError follows
    "rendezvous": (
        ["[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to (10.1.0.12, 29500).",
         "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.",
         *BOX],
        "connection_error", 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_true_cause_is_picked_among_many_errors(name: str) -> None:
    lines, reason, line_number = CASES[name]
    classifier = Classifier(PROGRAM, default_year=2025)
    for number, text in enumerate(lines, 1):
        classifier.feed(KeptLine(number, text, True, "job.log"))
    root, _ = choose_root_cause(classifier.found)
    assert (root.rule.reason, root.evidence.line_number) == (reason, line_number)
