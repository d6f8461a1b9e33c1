"""Loss read from kept lines of formats no filter rule reads (rules/sniff.py)."""

from __future__ import annotations

import pytest

from rules.progress import ProgressTracker
from rules.sniff import loss_fields


@pytest.mark.parametrize(("line", "want"), [
    ("step:2 - perf/max_memory_allocated_gb:41.29 - train/loss:nan - train/grad_norm:0.0", ("2", "nan")),  # verl
    ("completed step: 27, seconds: 2.013, TFLOP/s/device: 391.2, loss: 3.560", ("27", "3.560")),  # MaxText
    ("iter 100: loss 2.3101, time 120.05ms, mfu 35.21%", ("100", "2.3101")),  # nanoGPT
    ("epoch 1 step 20 loss: 2.3125 lr: 0.0001", ("20", "2.3125")),
    ("{'loss': 1.2, 'grad_norm': nan}", (None, "1.2")),
    ('{"loss": 1.23, "lr": 0.0002}', (None, "1.23")),
    ("loss=inf", (None, "inf")),
])
def test_a_training_loss_is_read(line: str, want: tuple[str | None, str]) -> None:
    assert loss_fields(line) == want


@pytest.mark.parametrize("line", [
    "val_loss: 2.31", "eval/loss: 1.02 - eval/runtime: 3.2", "Loss function: CrossEntropy",
    "loss scale: 65536", "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "lossy compression: 3", "no loss here",
])
def test_what_is_not_a_training_loss_is_not_read(line: str) -> None:
    assert loss_fields(line) is None


def test_kept_lines_are_read_only_until_a_filter_rule_reads_progress() -> None:
    tracker = ProgressTracker("a.log")
    tracker.observe_kept(1, "iter 1: loss 2.5, time 1ms")
    assert tracker.last_step == 1 and tracker.last_loss == 2.5
    tracker.observe(("step", "loss"), [2], [[b"2"], [b"2.4"]])  # a pack's (or learned) rule
    tracker.observe_kept(3, "iter 3: loss 9.9, time 1ms")
    assert tracker.last_step == 2 and tracker.last_loss == 2.4
