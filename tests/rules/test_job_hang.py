"""A finished log that shows a hang: time passes after the last progress line, with no error.

The built-in rules, a real JobRun, whole logs fed as one buffer. A log that simply ends is
not a hang (the job may still be running); a hang shows time passing: periodic lines with
time stamps (BLOOM's hourly PULSE cron line) far past the last step.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from rules.job import JobRun
from rules.rulebook import Rulebook


@pytest.fixture
def rulebook(builtin_rulebook: Rulebook) -> Rulebook:
    return builtin_rulebook


def _diagnose(rulebook: Rulebook, lines: list[str]):
    run = JobRun(rulebook)
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    return run.finish()


def _pulses(start: datetime, hours: int) -> list[str]:
    return [f"[{start + timedelta(hours=h, seconds=7):%Y-%m-%d %H:%M:%S}] PULSE: gpt-7b is running for 0-0{h}:00:07 "
            f"since 2025-03-14T09:00:00 (4379959 on 'gpu_p5' partition (gpu-[001-004])" for h in range(1, hours + 1)]


def _megatron(step: int, at: datetime) -> str:
    return (f"[default7]: [{at:%Y-%m-%d %H:%M:%S}] iteration {step:8d}/  250000 | consumed samples: {step * 512:12d} | "
            f"elapsed time per iteration (ms): 6104.2 | learning rate: 2.990000E-04 | global batch size:   512 | "
            f"lm loss: {2.5 - step / 1e4:.6E} | loss scale: 1.0 | grad norm: 0.281 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |")


def test_pulse_lines_hours_after_the_last_iteration_mean_stalled(rulebook: Rulebook) -> None:
    start = datetime(2025, 3, 14, 9, 0, 0)
    steps = [_megatron(s, start + timedelta(seconds=6 * s)) for s in range(1, 120)]
    diagnosis = _diagnose(rulebook, [*steps, *_pulses(start + timedelta(seconds=720), 4)])
    assert diagnosis.status == "stalled"
    assert diagnosis.root_cause.reason == "hang"
    assert diagnosis.root_cause.line == steps[-1]


def test_a_progress_line_without_a_time_stamp_is_timed_by_the_lines_after_it(rulebook: Rulebook) -> None:
    # HF Trainer's metrics dict carries no time stamp: the PULSE lines after it span 3 hours
    metrics = [f"{{'loss': {2.0 - i / 1000:.4f}, 'grad_norm': 0.41, 'learning_rate': 2e-05, 'epoch': {i / 100:.2f}}}"
               for i in range(1, 60)]
    diagnosis = _diagnose(rulebook, [*metrics, *_pulses(datetime(2025, 3, 14, 9, 0, 0), 3)])
    assert diagnosis.status == "stalled"
    assert diagnosis.root_cause.line == metrics[-1]


def test_a_single_late_line_after_an_untimed_progress_line_proves_nothing(rulebook: Rulebook) -> None:
    metrics = [f"{{'loss': {2.0 - i / 1000:.4f}, 'learning_rate': 2e-05, 'epoch': {i / 100:.2f}}}" for i in range(1, 60)]
    diagnosis = _diagnose(rulebook, [*metrics, *_pulses(datetime(2025, 3, 14, 9, 0, 0), 1)])
    assert diagnosis.status == "running"


def test_a_log_that_simply_ends_is_running_not_stalled(rulebook: Rulebook) -> None:
    start = datetime(2025, 3, 14, 9, 0, 0)
    diagnosis = _diagnose(rulebook, [_megatron(s, start + timedelta(seconds=6 * s)) for s in range(1, 120)])
    assert diagnosis.status == "running"
    assert diagnosis.root_cause is None


def _time_limit(at: datetime) -> list[str]:
    stamp = f"{at:%Y-%m-%dT%H:%M:%S}"
    return ["srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            f"slurmstepd: error: *** JOB 4379959 ON gpu-001 CANCELLED AT {stamp} DUE TO TIME LIMIT ***",
            f"[{at:%Y-%m-%d %H:%M:%S},120] torch.distributed.elastic.agent.server.api: [WARNING] Received Signals.SIGTERM "
            "death signal, shutting down workers",
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2003124 got signal: 15"]


def test_a_hang_the_time_limit_ended_is_the_root_cause_not_the_cancellation(rulebook: Rulebook) -> None:
    start = datetime(2025, 3, 14, 9, 0, 0)
    steps = [_megatron(s, start + timedelta(seconds=6 * s)) for s in range(1, 120)]
    diagnosis = _diagnose(rulebook, [*steps, *_pulses(start + timedelta(seconds=720), 3),
                                     *_time_limit(start + timedelta(hours=5))])
    assert diagnosis.status == "failed"
    assert diagnosis.root_cause.reason == "hang"
    assert diagnosis.root_cause.line == steps[-1]
    assert diagnosis.other_errors[0]["reason"] == "job_cancelled"


def test_an_untimed_progress_line_then_hours_of_pulses_then_the_time_limit(rulebook: Rulebook) -> None:
    metrics = [f"{{'loss': {2.0 - i / 1000:.4f}, 'learning_rate': 2e-05, 'epoch': {i / 100:.2f}}}" for i in range(1, 60)]
    start = datetime(2025, 3, 14, 9, 0, 0)
    diagnosis = _diagnose(rulebook, [*metrics, *_pulses(start, 3), *_time_limit(start + timedelta(hours=4))])
    assert (diagnosis.status, diagnosis.root_cause.reason) == ("failed", "hang")
    assert diagnosis.root_cause.line == metrics[-1]


def test_a_time_limit_reached_while_training_is_a_cancellation(rulebook: Rulebook) -> None:
    start = datetime(2025, 3, 14, 9, 0, 0)
    steps = [_megatron(s, start + timedelta(seconds=6 * s)) for s in range(1, 120)]
    diagnosis = _diagnose(rulebook, [*steps, *_time_limit(start + timedelta(seconds=6 * 120))])
    assert (diagnosis.status, diagnosis.root_cause.reason) == ("failed", "job_cancelled")


_SETUP = ["[default0]: > building GPT model ...",
          "[default0]: > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 1678626816",
          "gpu-001:4021:4105 [0] NCCL INFO comm 0x4df81900 rank 0 nranks 16 cudaDev 0 busId 85000 - Init COMPLETE",
          "gpu-001:4021:4021 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f78d7e00200 recvbuff 0x7f78d7e00200 "
          "count 1 datatype 1 op 0 root 0 comm 0x4df81900 [nranks=16] stream 0xb1a7570"]


def test_a_whole_log_that_stops_in_its_setup_with_no_error_is_a_stall_at_its_last_line(rulebook: Rulebook) -> None:
    """Not "running mid-training": not one step was logged. A live job's lines so far still
    read as running (it may be loading), and a clean exit still makes it healthy."""
    run = JobRun(rulebook)
    run.feed("job.log", ("\n".join(_SETUP) + "\n").encode())
    assert run.current().status == "running"
    diagnosis = run.finish()
    assert diagnosis.status == "stalled" and diagnosis.action == "investigate"
    root = diagnosis.root_cause
    assert (root.reason, root.line, root.line_number) == ("hang", _SETUP[-1], len(_SETUP))
    assert "before any training step" in diagnosis.mitigation

    from service.live.runs import with_exit_code

    assert with_exit_code(diagnosis.to_dict(), 0)["status"] == "healthy"


@pytest.mark.parametrize("last", [
    "Allowing ninja to set a default number of workers... (overridable by setting the environment variable MAX_JOBS=N)",
    "> compiling and loading fused kernels ...",
    "Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...",
])
def test_a_stall_in_a_kernel_build_at_start_up_is_the_users_stale_build_lock(rulebook: Rulebook, last: str) -> None:
    diagnosis = _diagnose(rulebook, [*_SETUP[:2], last])
    root = diagnosis.root_cause
    assert (diagnosis.status, root.reason, root.origin, root.line) == ("stalled", "hang", "user", last)
    assert "build directory" in diagnosis.mitigation
    # a stall anywhere else is not put on a build
    assert _diagnose(rulebook, _SETUP).root_cause.origin != "user"


def test_a_stack_dump_with_no_exception_is_a_stall_not_an_unknown_failure(rulebook: Rulebook) -> None:
    """py-spy or gdb's py-bt of a stuck rank: frames, no exception. People post them because
    the job hung; the frames are error-like for the guard, not an error of their own."""
    dump = [*_SETUP[:3], "(gdb) py-bt", "Traceback (most recent call first):",
            '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2050, '
            "in all_reduce", "    work = group.allreduce([tensor], opts)",
            '  File "/workspace/train.py", line 211, in train_step', "    dist.all_reduce(loss)"]
    diagnosis = _diagnose(rulebook, dump)
    assert diagnosis.status == "stalled" and diagnosis.root_cause.reason == "hang"


def test_a_whole_log_with_no_step_and_an_error_no_rule_knows_fails_on_that_line(rulebook: Rulebook) -> None:
    """Never silent: the error-like line is the lead, not the last line (a client's retries)."""
    lines = [*_SETUP[:2], "[2025-03-10 18:07:37 WARNING] 'QuorumWaitError(\"metadata quorum of 3 not reached\")' "
             "thrown while reading shard-00017", "[2025-03-10 18:07:37 WARNING] Retrying in 1s [Retry 1/5]."]
    diagnosis = _diagnose(rulebook, lines)
    assert diagnosis.status == "failed"
    assert diagnosis.root_cause.line_number == 3
