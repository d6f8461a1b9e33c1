"""Loss read from kept lines of formats no filter rule reads (rules/sniff.py)."""

from __future__ import annotations

import pytest

from rules.progress import ProgressTracker
from rules.sniff import bare_loss, loss_fields


@pytest.mark.parametrize(("line", "want"), [
    ("step:2 - perf/max_memory_allocated_gb:41.29 - train/loss:nan - train/grad_norm:0.0", ("2", "nan")),  # verl
    ("completed step: 27, seconds: 2.013, TFLOP/s/device: 391.2, loss: 3.560", ("27", "3.560")),  # MaxText
    ("iter 100: loss 2.3101, time 120.05ms, mfu 35.21%", ("100", "2.3101")),  # nanoGPT
    ("epoch 1 step 20 loss: 2.3125 lr: 0.0001", ("20", "2.3125")),
    ("{'loss': 1.2, 'grad_norm': nan}", (None, "1.2")),
    ('{"loss": 1.23, "lr": 0.0002}', (None, "1.23")),
    ("loss=inf", (None, "inf")),
    # RL trainers' policy loss (the critic's is another series)
    ("epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf|unsuper_loss: 0.0", ("3184", "inf")),  # DeepSpeed-Chat
    ("step:12 - actor/pg_loss:0.013 - critic/vf_loss:0.2", ("12", "0.013")),  # verl
    ("{'policy_loss': 0.12, 'value_loss': 3.0}", (None, "0.12")),  # OpenRLHF
    # a column-aligned progress line and a logger's bracketed key (two independent threads)
    ("step 1655 - loss        nan - moving ave loss        nan", ("1655", "nan")),
    ("2023-02-15 10:12:01.123 | INFO | [Loss] nan | [lr] 0.0002", (None, "nan")),
])
def test_a_training_loss_is_read(line: str, want: tuple[str | None, str]) -> None:
    assert loss_fields(line) == want


@pytest.mark.parametrize("line", [
    "val_loss: 2.31", "eval/loss: 1.02 - eval/runtime: 3.2", "Loss function: CrossEntropy",
    "loss scale: 65536", "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "lossy compression: 3", "no loss here", "cri_loss: 4.0 | value_loss: 3.1",
])
def test_what_is_not_a_training_loss_is_not_read(line: str) -> None:
    assert loss_fields(line) is None


def test_kept_lines_are_read_only_until_a_filter_rule_reads_progress() -> None:
    tracker = ProgressTracker("a.log")
    tracker.observe_kept(1, "iter 1: loss 2.5, time 1ms")
    tracker.flush_kept()
    assert tracker.last_step == 1 and tracker.last_loss == 2.5
    tracker.observe(("step", "loss"), [2], [[b"2"], [b"2.4"]])  # a pack's (or learned) rule
    tracker.observe_kept(3, "iter 3: loss 9.9, time 1ms")
    tracker.flush_kept()
    assert tracker.last_step == 2 and tracker.last_loss == 2.4


def test_a_total_loss_is_a_training_loss() -> None:
    # detectron2's and DINOv2's metric printers
    assert loss_fields("iter: 19  total_loss: 2.401  loss_cls: 0.9  lr: 0.0001") == ("19", "2.401")
    assert loss_fields("Training  [     40/5000000]  total_loss: inf (inf)  koleo_loss: inf (inf)") == (None, "inf")
    assert loss_fields("dino_local_crops_loss: 10.5020 (10.5017)") is None


@pytest.mark.parametrize(("line", "want"), [
    ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}", "nan"),
    ('{"loss": 2.23302879, "acc": 0.26443233, "grad_norm": NaN, "learning_rate": 1.617e-05}', "NaN"),
    ("Step   1560 | Loss: 0.5275 | LR: 3.00e-04 | GradNorm: 2.29 | TPS: 16.88K", "2.29"),
    ("step:2 - train/loss:0.5 - train/grad_norm:inf", "inf"),
    ("{'loss': 1.2, 'max_grad_norm': 1.0}", None),
    ("{'loss': 1.2, 'clip_grad_norm': 1.0}", None),
])
def test_the_gradient_norm_of_a_loss_line_is_read(line: str, want: str | None) -> None:
    from rules.sniff import grad_norm_field

    assert grad_norm_field(line) == want


def _tracked(lines: list[str]) -> ProgressTracker:
    tracker = ProgressTracker("a.log")
    for number, line in enumerate(lines, 1):
        tracker.observe_kept(number, line)
    tracker.flush_kept()
    tracker.spikes.finish()
    return tracker


def test_a_log_that_ends_on_a_non_finite_gradient_norm_diverged() -> None:
    healthy = ['{"loss": 1.435, "grad_norm": 3.48}', '{"loss": 1.394, "grad_norm": 4.17}']
    spike = _tracked([*healthy, '{"loss": 2.233, "grad_norm": NaN}']).spikes.failed
    assert spike is not None and spike.kind == "nan" and spike.line_number == 3
    # one overflow step that the loss scaler skipped, and training went on: not a failure
    assert _tracked([*healthy, '{"loss": 1.41, "grad_norm": inf}', '{"loss": 1.40, "grad_norm": 3.9}']).spikes.failed is None


@pytest.mark.parametrize(("line", "want"), [
    ("76980 nan", ("76980", "nan")),
    ("  120\t2.6496577", ("120", "2.6496577")),
    ("tensor(nan, device='cuda:0')", (None, "nan")),
    ("tensor(3.2207, device='cuda:0', grad_fn=<NllLossBackward0>)", (None, "3.2207")),
    ("tensor(inf)", (None, "inf")),
    ("2025-03-04 05:06:07,200 76980 nan", ("76980", "nan")),  # behind a logger's or a launcher's prefix
    ("[rank3]: tensor(nan, device='cuda:0')", (None, "nan")),
    ("10.140.0.17: 76980 nan", ("76980", "nan")),
])
def test_a_bare_value_line_is_read(line: str, want: tuple[str | None, str]) -> None:
    assert bare_loss(line) == want


@pytest.mark.parametrize("line", ["76980 nan nan", "2024-05-01 nan", "tensor([nan, 1.0])", "step 3 nan", "x 1 2"])
def test_what_is_not_a_bare_value_line_is_not_read(line: str) -> None:
    assert bare_loss(line) is None


def spike_of(lines: list[str]):
    tracker = ProgressTracker()
    for number, text in enumerate(lines, 1):
        tracker.observe_kept(number, text)
    tracker.flush_kept()
    tracker.spikes.finish()
    return tracker.spikes.failed


@pytest.mark.parametrize("series", [
    ["76930 2.6496577", "76940 2.59109", "76980 nan", "76990 nan", "Saving the model", "77000 nan"],  # BART pretraining
    ["tensor(3.2207, device='cuda:0')", "tensor(nan, device='cuda:0')", "tensor(nan, device='cuda:0')"],  # a LoRA loop
])
def test_a_bare_series_that_turns_nan_and_stays_is_a_nan_loss_from_its_first_nan(series: list[str]) -> None:
    spike = spike_of(series)
    assert spike is not None and spike.kind == "nan"
    assert spike.line == next(line for line in series if "nan" in line)


@pytest.mark.parametrize("series", [
    ["tensor(nan, device='cuda:0')", "tensor(nan, device='cuda:0')"],  # never finite: not a series that turned
    ["76930 2.64", "76940 nan", "76950 2.61", "76960 nan"],             # one NaN at a time, finite between
    ["76930 2.64", "76940 nan"],                                         # one NaN alone
])
def test_a_bare_nan_that_does_not_stay_or_never_followed_a_value_is_not_a_loss(series: list[str]) -> None:
    assert spike_of(series) is None
