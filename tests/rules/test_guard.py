"""The error guard: what counts as an error line, the same with Hyperscan and with RE2."""

from __future__ import annotations

import pytest

from rules.guard import ErrorGuard

ERROR_LINES = [
    "[default3]:terminate called after throwing an instance of 'c10::CUDAError'",
    "[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout",
    # torch >= 2.2 does not zero-pad the month (pytorch/pytorch#113128): an E-level record of
    # March with no error word of its own
    "[rank0]:[E314 04:01:29.500973224 ProcessGroupNCCL.cpp:2573] [PG ID 1 PG GUID 1 Rank 0] First PG on this rank to signal dumping.",
    "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508)",
    "E1128 21:12:50.390000 3139541 site-packages/torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -6)",
    "Traceback (most recent call last):",
    '  File "/workspace/Megatron-LM/pretrain_gpt.py", line 12, in <module>',
    "KeyError: 'lr'",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB.",
    "kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.216.210.236<54862>",
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    "slurmstepd: error: *** STEP 494583.0 ON node-1 CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***",
    "srun: error: nid01934: tasks 2,4-5,7: Terminated",
    "RuntimeError: DataLoader worker (pid 9382) is killed by signal: Killed.",
    "W0227 17:39:41.936000 293817 site-packages/torch/distributed/elastic/agent/server/api.py:719] Received 15 death signal, shutting down workers",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x11a",
    "Segmentation fault (core dumped)",
    "[2024-07-17 19:44:06,829] Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
]
ROUTINE_LINES = [
    "[default7]: [2025-03-31 05:54:07] iteration       50/  242204 | consumed samples:        50400 | lm loss: 6.258318E+00 | number of nan iterations:   0 |",
    "gcn6:1080060:1080060 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB",
    "  accumulate_allreduce_grads_in_fp32 .............. False",
    "NCCL_ASYNC_ERROR_HANDLING: 0",
    "[INFO|trainer.py:2405] 2025-03-06 12:04:09,913 >> ***** Running training *****",
    "[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  memory: 49.66GiB(52.28%)",
    "[default0]:[W socket.cpp:436] [c10d] The server socket has been closed",
]


@pytest.fixture(scope="module", params=["hyperscan", "re2"])
def guard(request) -> ErrorGuard:
    return ErrorGuard(engine=request.param)


@pytest.mark.parametrize("line", ERROR_LINES)
def test_error_lines_are_error_like(guard: ErrorGuard, line: str) -> None:
    assert guard.is_error_like(line)


@pytest.mark.parametrize("line", ROUTINE_LINES)
def test_routine_lines_are_not(guard: ErrorGuard, line: str) -> None:
    assert not guard.is_error_like(line)


def test_engines_agree_on_a_mixed_buffer() -> None:
    data = ("\n".join((ERROR_LINES + ROUTINE_LINES) * 3) + "\n").encode()
    spans = {engine: ErrorGuard(engine=engine).error_line_spans(data) for engine in ("hyperscan", "re2")}
    assert spans["hyperscan"] == spans["re2"]
    assert len(spans["re2"]) == 3 * len(ERROR_LINES)


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="guard engine"):
        ErrorGuard(engine="grep")


def test_threads_scan_at_the_same_time(guard: ErrorGuard) -> None:
    """The server filters concurrent uploads in a thread pool: one guard serves them all."""
    import threading

    data = b"".join(b"[rank%d]: iteration %d | lm loss 2.1\n" % (i % 8, i) for i in range(20000))
    data += b"[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    expected = guard.error_line_spans(data)
    results: list[object] = []
    start = threading.Barrier(8)

    def scan() -> None:
        start.wait()
        try:
            results.extend(guard.error_line_spans(data) == expected for _ in range(20))
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            results.append(exc)

    threads = [threading.Thread(target=scan) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 160



def test_the_compiled_guard_is_kept_on_disk_and_a_bad_copy_is_compiled_again(tmp_path, monkeypatch) -> None:
    pytest.importorskip("hyperscan")
    monkeypatch.setenv("FAULTLINE_CACHE_DIR", str(tmp_path))
    text = "\n".join(["step 1 ok", *ERROR_LINES, "step 2 ok"]).encode() + b"\n"
    want = ErrorGuard(engine="re2").error_line_spans(text)

    assert ErrorGuard(engine="hyperscan").error_line_spans(text) == want  # compiled, then stored
    (stored,) = tmp_path.glob("hyperscan-*.db")
    assert ErrorGuard(engine="hyperscan").error_line_spans(text) == want  # read back
    # other patterns are another file, never the stored database
    first = ErrorGuard(ErrorGuard().patterns[:1], engine="hyperscan")
    assert len(list(tmp_path.glob("hyperscan-*.db"))) == 2
    assert len(first.error_line_spans(text)) < len(want)
    size = stored.stat().st_size
    stored.write_bytes(stored.read_bytes()[:100])  # cut short (a full disk, another build)
    assert ErrorGuard(engine="hyperscan").error_line_spans(text) == want
    assert stored.stat().st_size == size  # written again, whole
