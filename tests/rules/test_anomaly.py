"""Loss spikes in progress values: short pasted excerpts, a jump the log ends on, a run of
NaN gradient norms; and what must stay calm (a jump that comes back, one fp16 overflow)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rules.anomaly import NAN_GRAD_POINTS, LossSpikeDetector
from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook

NAN = math.nan


def feed(losses: list[float | None], grads: list[float | None] = ()) -> LossSpikeDetector:
    """Each point its own batch, as a pasted excerpt with chatter between metric lines gives them."""
    detector = LossSpikeDetector()
    grads = list(grads) or [None] * len(losses)
    for i, (loss, grad) in enumerate(zip(losses, grads, strict=True)):
        detector.observe([i + 1], [float(i)], [loss], [NAN], lambda n: f"line {n}",
                         [grad] if any(g is not None for g in grads) else ())
    detector.finish()
    return detector


def test_a_jump_after_two_steps_that_the_excerpt_ends_on_is_a_spike() -> None:
    # BLOOM tr8 exp 11: 3.06, 3.11, then 7.71 at the last iteration pasted
    spike = feed([3.06, 3.11, 7.71]).failed
    assert spike is not None and spike.kind == "diverged" and spike.line_number == 3


def test_a_short_excerpt_needs_a_doubling_not_the_long_runs_ratio() -> None:
    assert feed([3.0, 3.1, 5.0]).failed is None  # 1.6x: a long run's ratio, not a short one's
    assert feed([3.0, 3.1, 5.0, 3.1]).failed is None


def test_a_jump_that_comes_back_is_not_a_failure() -> None:
    detector = feed([2.2] * 20 + [5.1, 4.0, 2.3] + [2.2] * 5)
    assert detector.failed is None and len(detector.recovered) == 1


def test_a_nan_loss_soon_after_a_jump_that_came_back_began_with_that_jump() -> None:
    spike = feed([5.63, 5.30, 153318.95, 5.75, 5.62, NAN, 5.10, NAN]).failed
    assert spike is not None and spike.kind == "nan" and spike.line_number == 3
    # after a smaller jump (per-micro-batch noise), or long after a big one, it is its own start
    spike = feed([0.53, 1.55, 2.33, 1.14, 1.30, 3.67, 1.13, 1.12, NAN, NAN]).failed
    assert spike is not None and spike.line_number == 9
    spike = feed([5.63, 5.30, 153318.95] + [5.5] * 20 + [NAN]).failed
    assert spike is not None and spike.line_number == 24


def test_a_loss_still_up_after_a_few_points_at_the_end_is_a_spike() -> None:
    assert feed([2.0] * 20 + [3.5] * 6).failed is not None


def test_a_run_of_nan_gradient_norms_is_divergence_even_with_a_finite_loss() -> None:
    # LLaMA-Factory on NPU: grad_norm nan from one logging step on, the loss then 0.0
    losses = [1.46, 1.45, 0.0, 0.0, 0.0]
    grads = [0.9, NAN, NAN, NAN, NAN]
    spike = feed(losses, grads).failed
    assert spike is not None and spike.kind == "nan" and spike.line_number == 2 and spike.line == "line 2"


def test_one_overflowing_step_is_not_divergence() -> None:
    grads = [0.9, NAN, 0.8] * 10 + [NAN] * (NAN_GRAD_POINTS - 1) + [0.7]
    assert feed([2.0] * len(grads), grads).failed is None


def test_lines_without_a_gradient_norm_do_not_break_a_run() -> None:
    grads = [NAN, None, NAN, None, NAN]
    assert feed([2.0] * 5, grads).failed is not None


def test_a_gradient_norm_that_explodes_and_stays_up_is_divergence_though_the_loss_stays_finite() -> None:
    # a VLM fine-tune: the pre-clip norm goes from about 1 to millions while the loss creeps up
    grads = [1.1, 0.9, 1.2, 1.0, 2.4e6, 3.1e6, 2.9e6, 3.5e6]
    spike = feed([2.5, 2.5, 2.6, 2.5, 2.6, 2.7, 2.8, 3.3], grads).failed
    assert spike is not None and spike.kind == "grad_norm" and spike.line_number == 5
    assert spike.baseline is not None and spike.baseline < 2 and spike.peak >= 2.4e6


def test_a_log_that_starts_with_absurd_gradient_norms_is_divergence() -> None:
    spike = feed([2.55, 2.70, 2.67], [6.4e6, 2.9e6, 2.6e7]).failed
    assert spike is not None and spike.kind == "grad_norm" and spike.line_number == 1


def test_gradient_norms_that_start_high_and_fall_or_blip_once_are_healthy() -> None:
    # early pretraining: large norms that fall; a later one-step blip that the next step undoes
    grads = [900.0, 300.0, 80.0, 20.0, 8.0, 5.0, 4.0, 60.0, 4.5, 4.0, 3.9]
    assert feed([7.0 - 0.1 * i for i in range(len(grads))], grads).failed is None
    assert feed([3.0] * 4, [1.0, 1.1, 0.9, 40.0]).failed is None  # the excerpt ends on one blip


def test_when_the_loss_jumps_too_its_own_spike_is_the_root_cause() -> None:
    # BLOOM tr8 exp 11: grad norm 13k -> 262k at 11447, lm loss 3.11 -> 7.71 at 11448
    spike = feed([3.06, 3.11, 7.71], [12952.0, 262623.0, 254699.0]).failed
    assert spike is not None and spike.kind == "diverged" and spike.line_number == 3


def test_a_format_no_pack_knows_is_read_for_its_loss(builtin_rulebook: Rulebook) -> None:
    """verl prints `step:N - ... - train/loss:L`, which no pack reads: the kept lines are
    sniffed for their loss (rules/sniff.py), so a loss gone NaN is a loss spike with its
    first line."""
    lines = [f"step:{n} - perf/max_memory_allocated_gb:41.29 - train/loss:{loss} - train/grad_norm:0.0 - train/lr:1e-06"
             for n, loss in ((1, "2.31"), (2, "nan"), (3, "nan"))]
    run = JobRun(builtin_rulebook, JobMeta(name="verl-sft"))
    run.feed("train.log", "\n".join(lines).encode() + b"\n")
    diagnosis = run.finish()
    assert diagnosis.root_cause is not None and diagnosis.root_cause.reason == "loss_spike"
    assert diagnosis.root_cause.line == lines[1]


def _spikes(losses: list[float | None], grads: list[float | None], cuts: list[int]) -> tuple:
    """The detector's verdict when the points come in batches ending at `cuts`."""
    detector = LossSpikeDetector()
    bounds = sorted({0, len(losses), *(c for c in cuts if 0 < c < len(losses))})
    for start, stop in zip(bounds, bounds[1:], strict=False):
        detector.observe(list(range(start + 1, stop + 1)), [float(i) for i in range(start, stop)], losses[start:stop],
                         [NAN] * (stop - start), lambda n: f"line {n}", grads[start:stop] if any(grads) else ())
    detector.finish()
    return ([(s.kind, s.line_number, s.recovered) for s in detector.spikes],
            [(s.kind, s.line_number) for s in detector.recovered])


_VALUE = st.one_of(st.floats(min_value=-2.0, max_value=12.0, allow_nan=False), st.just(math.nan), st.none())


@settings(max_examples=300, deadline=None)
@given(losses=st.lists(_VALUE, min_size=1, max_size=60),
       grads=st.lists(st.one_of(st.floats(min_value=0.0, max_value=2e5, allow_nan=False), st.just(math.inf), st.none()),
                      max_size=60),
       cuts=st.lists(st.integers(min_value=1, max_value=59), max_size=6))
def test_batches_are_read_as_their_points_one_by_one(losses, grads, cuts) -> None:
    """A pasted log is one batch, a long one a batch per buffer or sample: where the batches
    fall never changes what is found (sniffed points are read a buffer at a time)."""
    grads = (grads + [None] * len(losses))[:len(losses)]
    assert _spikes(losses, grads, cuts) == _spikes(losses, grads, list(range(1, len(losses))))


def test_a_batch_whose_points_lower_the_threshold_as_they_come_is_not_calm() -> None:
    # two points of 2.0 and 2.1, then eight of 2.0 make the long run's ratio apply: 3.5 is a
    # jump point by point, and so it is in one batch
    losses = [2.0, 2.1] + [2.0] * 8 + [3.5] * 6
    assert _spikes(losses, [None] * len(losses), [2]) == _spikes(losses, [None] * len(losses), list(range(1, 16)))
    assert _spikes(losses, [None] * len(losses), [2])[0]
