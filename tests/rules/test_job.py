"""The job run as the agents see it (JobView), and a failure that no rule knows: never silent."""

from __future__ import annotations

import pytest

from rules.job import JobMeta, JobRun, JobView
from rules.model import KeptLine
from rules.rulebook import Rulebook


STEP = (" [2025-03-31 05:54:07] iteration       {step}/  242204 | consumed samples:        50400 | elapsed time per "
        "iteration (ms): 1552.8 | learning rate: 8.000000E-06 | global batch size:  1008 | lm loss: 6.258318E+00 | "
        "loss scale: 1.0 | grad norm: 1.520 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _run(rulebook: Rulebook, lines: list[str], **meta) -> JobRun:
    run = JobRun(rulebook, JobMeta(**meta))
    run.feed("job.log", ("\n".join(lines) + "\n").encode())
    return run


def test_the_view_shows_the_run_read_only_and_forwards_lines(builtin_rulebook: Rulebook) -> None:
    run = _run(builtin_rulebook, [
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        STEP.format(step=50),
        "checkpoint saved at step 50",
    ], name="gpt-7b-20250301-ab12cd", framework="megatron")
    view = run.view()
    assert isinstance(view, JobView)
    assert view.meta.family == "gpt-7b" and view.meta.framework == "megatron"
    assert [line.text for line in view.kept_lines()] == [line.text for line in run.compressed.lines()]
    assert view.found is run.classifier.found and any(f.rule.reason == "out_of_memory" for f in view.found.values())
    assert view.diagnosis_program is run.classifier.program
    assert view.default_node("job.log") is None
    with pytest.raises(AttributeError):
        view.classifier  # noqa: B018 - the internals are not part of the view
    with pytest.raises(AttributeError):
        view.meta = JobMeta()
    assert not any(f.rule.reason == "ecc_error" for f in view.found.values())
    # a line the guard did not flag, judged error-like by an agent: it reaches the classifier
    view.forward_error_lines([KeptLine(99, "gpu 3 reports: uncorrectable ECC error encountered", False, "job.log")])
    assert any(f.rule.reason == "ecc_error" for f in view.found.values())


@pytest.mark.parametrize(("lines", "root"), [
    (["building extension fused_adam", "g++ -c csrc/adam/fused_adam.cpp -o fused_adam.o",
      "csrc/includes/context.h:7:10: fatal error: cuda_runtime.h: No such file or directory"],
     "fatal error: cuda_runtime.h: No such file or directory"),
    (["reading shard 00042 from s3://bucket/data", "Curl returned error code 55"], "Curl returned error code 55"),
    ([STEP.format(step=10), "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
      "    shard = store.read(key)", "storage.client.QuorumLost: 2 of 3 replicas unreachable"],
     "storage.client.QuorumLost: 2 of 3 replicas unreachable"),
    (["epoch 3: reading batch", "storage client died: quorum 2 of 3 lost, error 14"], "storage client died"),
])
def test_a_fatal_line_no_rule_knows_is_a_failure_naming_that_line(builtin_rulebook: Rulebook, lines: list[str],
                                                                    root: str) -> None:
    d = _run(builtin_rulebook, lines).finish()
    assert d.status == "failed"
    assert d.root_cause is not None and root in d.root_cause.line


@pytest.mark.parametrize("lines", [
    # an error that training got past, then progress: still running
    ["Connection error while fetching config, retrying", STEP.format(step=10), STEP.format(step=11)],
    # warnings and counters of zero errors are not failures
    ["UserWarning: TypedStorage is deprecated and will fail in a future release", STEP.format(step=10)],
    [STEP.format(step=10), "validation: 0 errors, 12 samples"],
    # NCCL's INFO lines are never its errors: each rank's communicator teardown at exit
    [STEP.format(step=10), "8429a87:359:940 [3] NCCL INFO comm 0xcf44370 rank 3 nranks 4 cudaDev 3 busId 400000 - Abort COMPLETE"],
])
def test_lines_that_went_on_working_do_not_fail_a_job(builtin_rulebook: Rulebook, lines: list[str]) -> None:
    assert _run(builtin_rulebook, lines).finish().status == "running"


BOX = ["WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2410413 closing signal SIGTERM",
       "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 2410412) of "
       "binary: /usr/bin/python",
       "Traceback (most recent call last):",
       '  File "/usr/local/bin/torchrun", line 8, in <module>',
       "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
       "train.py FAILED"]


def test_a_sigkill_with_no_error_of_the_jobs_own_is_the_hosts_oom_killer(builtin_rulebook: Rulebook) -> None:
    d = _run(builtin_rulebook, [STEP.format(step=10), *BOX]).finish()
    assert d.status == "failed" and d.action == "fix_and_resubmit"
    root = d.root_cause
    assert (root.reason, root.origin, root.source) == ("out_of_memory", "user", "evidence:sigkill")
    assert "exitcode: -9" in root.line and root.confidence < 0.6 and "OOM killer" in d.mitigation


@pytest.mark.parametrize("lines", [
    # DeepSpeed's launcher, its command line wrapped by the terminal before the exit code
    ["[2023-11-13 16:59:54,760] [INFO] [launch.py:314:sigkill_handler] Killing subprocess 9439",
     "[2023-11-13 16:59:55,650] [ERROR] [launch.py:320:sigkill_handler] ['/opt/conda/bin/python', '-u', 'train.py', ",
     "'--local_rank=1', '--stage', '1'", "] exits with return code = -9"],
    ["mpirun noticed that process rank 3 with PID 0 on node gpu-07 exited on signal 9 (Killed)."],
])
def test_other_launchers_reports_of_a_sigkill_are_read_too(builtin_rulebook: Rulebook, lines: list[str]) -> None:
    d = _run(builtin_rulebook, [STEP.format(step=10), *lines]).finish()
    root = d.root_cause
    assert (root.reason, root.source) == ("out_of_memory", "evidence:sigkill") and root.line == lines[-1]


def test_a_sigkill_after_the_jobs_own_error_leaves_that_error_the_cause(builtin_rulebook: Rulebook) -> None:
    own = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
           "KeyError: 'optimizer'"]
    d = _run(builtin_rulebook, [STEP.format(step=10), *own, *BOX]).finish()
    assert d.root_cause.reason == "key_error"


def test_an_indented_exception_after_a_frame_is_the_error_not_the_frames_source(builtin_rulebook: Rulebook) -> None:
    """torchrun's failure box indents the worker's traceback (`traceback : Traceback ...`,
    frames at four spaces, their source lines at six, the exception at two). The frame's
    source line is skipped as code; the exception after it, indented less, is the error."""
    lines = [
        "traceback : Traceback (most recent call last):",
        '    File "/work/train.py", line 162, in main',
        "      torch.cuda.set_device(device)",
        "  RuntimeError: CUDA error: invalid device ordinal",
    ]
    root = _run(builtin_rulebook, lines).finish().root_cause
    assert (root.reason, root.source, root.line) == ("cuda_error", "rule:cuda.invalid-device", lines[3])
    # a source line that itself reads like the error (deeper than its frame) is still code
    code = ['  File "/work/train.py", line 9, in main', '    raise RuntimeError("CUDA error: invalid device ordinal")',
            "ValueError: bad config"]
    root = _run(builtin_rulebook, ["Traceback (most recent call last):", *code]).finish().root_cause
    assert root.line == code[2]


ORTE = ["--------------------------------------------------------------------------",
        "ORTE has lost communication with a remote daemon.",
        "",
        "  HNP daemon   : [[64112,0],0] on node gpu-head",
        "  Remote daemon: [[64112,0],1] on node gpu-017",
        "",
        "This is usually due to either a failure of the TCP network",
        "connection to the node, or possibly an internal failure of",
        "the daemon itself. We cannot recover from this failure, and",
        "therefore will terminate the job."]


def test_open_mpi_losing_a_node_daemon_is_the_cause_and_its_timing_says_whose(builtin_rulebook: Rulebook) -> None:
    """mpirun's launcher lost a node's daemon: after training steps, the node or its link
    went away (restart elsewhere); before any step, the launch cannot reach its nodes."""
    trained = _run(builtin_rulebook, [STEP.format(step=10), *ORTE]).finish()
    assert (trained.root_cause.source, trained.root_cause.origin, trained.action) == (
        "rule:mpi.daemon-lost", "infrastructure", "restart")
    at_start = _run(builtin_rulebook, ORTE).finish()
    assert (at_start.root_cause.source, at_start.root_cause.origin, at_start.action) == (
        "rule:mpi.daemon-lost", "user", "fix_and_resubmit")


@pytest.mark.parametrize(("report", "cause"), [
    # torch.autograd's anomaly mode raising in loss.backward()
    (["Traceback (most recent call last):", '  File "train.py", line 544, in train', "    loss.backward()",
      "RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output."], 3),
    # transformers' DebugUnderflowOverflow report, which holds no error word of its own
    (["Detected inf/nan during batch_number=12", "Last 21 forward frames:", "abs min  abs max  metadata",
      "                  encoder.block.2.layer.1.dropout Dropout", "3.18e-04 6.27e+04 input[0]",
      "0.00e+00      inf output"], 0),
])
def test_a_frameworks_nan_detector_is_a_loss_spike_of_the_training(builtin_rulebook: Rulebook, report: list[str],
                                                                   cause: int) -> None:
    """A NaN detector that stopped the run names the numerics, not the exception's type."""
    root = _run(builtin_rulebook, [STEP.format(step=10), *report]).finish().root_cause
    assert (root.source, root.reason, root.origin, root.line) == (
        "rule:training.nan-check", "loss_spike", "training", report[cause])


@pytest.mark.parametrize(("line", "source"), [
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 163840, Hardware limit: 101376.",
     "rule:torch.compile-failed"),
    ("torch._dynamo.exc.FailOnRecompileLimitHit: recompile_limit reached with fullgraph=True.", "rule:torch.compile-failed"),
    # no rule knows it, but the line is the job's last exception: never silent
    ("requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='hub.example.org', port=443): Read timed out.", "unmatched"),
])
def test_an_exception_named_by_its_module_without_an_error_word_is_the_failure(
        builtin_rulebook: Rulebook, line: str, source: str) -> None:
    """`pkg.errors.X: `, `pkg.exc.X: `, `pkg.exceptions.X: `: the module says it is an exception."""
    diagnosis = _run(builtin_rulebook, [STEP.format(step=10), line]).finish()
    assert diagnosis.status == "failed" and diagnosis.root_cause.line == line
    assert diagnosis.root_cause.source == source


def test_connect_retries_before_a_run_that_trains_are_not_a_failure(builtin_rulebook: Rulebook) -> None:
    """Workers that start before the master retry the store and say so, then train: routine
    at every multi-node start, so the warnings must not make a healthy run 'failed'."""
    retries = ["[W socket.cpp:663] [c10d] The client socket has failed to connect to [gpu-001]:29500 "
               "(errno: 111 - Connection refused)."] * 3
    diagnosis = _run(builtin_rulebook, [*retries, *(STEP.format(step=s) for s in range(10, 30))]).finish()
    assert diagnosis.status == "running" and diagnosis.root_cause is None


TIMED_OUT = ("[W socket.cpp:601] [c10d] The client socket has timed out after 60s while trying to connect to "
             "(node-1, 29500).")


def test_an_error_a_rule_knows_that_training_went_on_past_is_not_the_root_cause(builtin_rulebook: Rulebook) -> None:
    """A rule knows the line (c10d gave up one connection attempt), and twenty steps follow
    it: the job is running, and the line is listed among the other errors as survived. Before,
    any rule's match made the job `failed`, so a live job was reported dead mid-run."""
    diagnosis = _run(builtin_rulebook, [TIMED_OUT, *(STEP.format(step=s) for s in range(10, 30))]).finish()
    assert diagnosis.status == "running" and diagnosis.root_cause is None
    assert [(e["reason"], e["line"], e.get("survived")) for e in diagnosis.other_errors] == [
        ("connection_error", TIMED_OUT, True)]


def test_what_ended_the_job_after_a_survived_error_is_the_root_cause(builtin_rulebook: Rulebook) -> None:
    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    diagnosis = _run(builtin_rulebook, [TIMED_OUT, *(STEP.format(step=s) for s in range(10, 30)), oom]).finish()
    assert diagnosis.status == "failed" and diagnosis.root_cause.reason == "out_of_memory"
    assert any(e.get("survived") and e["line"] == TIMED_OUT for e in diagnosis.other_errors)


@pytest.mark.parametrize("steps_after", [0, 1, 2])
def test_a_step_or_two_printed_after_an_error_do_not_hide_it(builtin_rulebook: Rulebook, steps_after: int) -> None:
    """Rank 0 can print a step or two before it blocks on the rank that died: the error
    still ended the job."""
    oom = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    lines = [*(STEP.format(step=s) for s in range(10, 20)), oom, *(STEP.format(step=s) for s in range(20, 20 + steps_after))]
    diagnosis = _run(builtin_rulebook, lines).finish()
    assert diagnosis.status == "failed" and diagnosis.root_cause.reason == "out_of_memory"


def test_an_error_that_repeats_after_the_steps_is_not_survived(builtin_rulebook: Rulebook) -> None:
    diagnosis = _run(builtin_rulebook, [TIMED_OUT, *(STEP.format(step=s) for s in range(10, 30)), TIMED_OUT]).finish()
    assert diagnosis.status == "failed" and diagnosis.root_cause.reason == "connection_error"


def test_a_traceback_cut_before_its_exception_still_names_a_line(builtin_rulebook: Rulebook) -> None:
    """Never silent: a paste that stops inside a traceback has no exception line; the job
    failed all the same, and the error-like line it printed last is the lead."""
    lines = [STEP.format(step=10), "Traceback (most recent call last):",
             '  File "/workspace/train.py", line 88, in <module>', "    main()",
             '  File "/workspace/train.py", line 80, in main']
    diagnosis = _run(builtin_rulebook, lines).finish()
    assert diagnosis.status == "failed"
    assert diagnosis.root_cause is not None and diagnosis.root_cause.line == lines[1]
    assert diagnosis.root_cause.source == "unmatched"
