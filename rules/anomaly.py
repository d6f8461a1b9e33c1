"""Loss spikes seen in the progress values: a jump that does not come back, NaN/inf, a
collapsing fp16 loss scale.

A spike that recovers on its own (BLOOM-176B's 2.2 -> 5.1 came back within ~30 iterations)
is not a failure and is only reported as such; one that stays up is, and its first line
is the root-cause line. Checks run per batch and touch single points only when a batch
crosses the threshold, because batches arrive at filter speed.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

BASELINE_POINTS = 64
MIN_BASELINE = 10
SHORT_BASELINE = 2
"""A pasted excerpt shows a few steps before the jump: from 2 points on, a jump must be
SHORT_JUMP_RATIO high to count (BLOOM tr8's 3.1 -> 7.7 after two iterations)."""
SHORT_JUMP_RATIO = 2.0
SINGLE_JUMP_RATIO = 3.0
"""An excerpt that begins one step before the jump (litgpt: 1.70, then 11.5 for the rest of
the paste): one point is a baseline only for a jump to three times it, and only when it is
a real loss (above 0: a first logged loss of 0.0 is an accumulation artefact)."""
JUMP_RATIO = 1.5
JUMP_ABSOLUTE = 0.5
NAN_GRAD_POINTS = 3
"""Consecutive points with a NaN/inf gradient norm: one is an fp16 overflow step that the
loss scaler skips; a run of them is divergence (the loss may stay finite, even 0.0)."""
GRAD_BASELINE_POINTS = 32
GRAD_MIN_BASELINE = 3
GRAD_JUMP_RATIO = 10.0
GRAD_EXPLODED = 1e5
"""A finite gradient norm explodes when it reaches GRAD_JUMP_RATIO times the median of at
least GRAD_MIN_BASELINE earlier ones, or GRAD_EXPLODED whatever came before (a pasted
excerpt that starts in the trouble: a VLM fine-tune logging norms in the millions from its
first line while the loss climbs; BLOOM-104B ran at 13k). Clipping hides it from the loss for
a while. A log that ends on two or more exploded points is diverging; one that comes back
under the limit recovered (a healthy run's spike: 0.3 -> 261 -> 0.3 in 20 iterations)."""
RECOVERED_RATIO = 1.15
NAN_AFTER_SPIKE_POINTS = 5
NAN_AFTER_SPIKE_RATIO = 10.0
"""A NaN/inf loss this few points after a jump to ten times the baseline that came back began
with that jump (a Gemma SFT: loss 5.3 -> 153,318 with a NaN gradient norm, 5.75 next, then NaN
losses on and off). A smaller jump is the noise of per-micro-batch losses (litgpt: 1.3, 3.7,
1.1, then NaN after the first optimizer step): the NaN is its own start."""
SUSTAIN_POINTS = 50
END_SUSTAIN_POINTS = 5
COLLAPSED_LOSS_SCALE = 1.0
HEALTHY_LOSS_SCALE = 128.0


@dataclass(frozen=True, slots=True)
class Spike:
    kind: str
    """`diverged`, `nan`, `loss_scale` or `grad_norm` (the gradient norm exploded)."""
    line_number: int
    line: str
    step: int | None
    baseline: float | None
    peak: float | None
    recovered: bool = False


@dataclass(slots=True)
class _Candidate:
    line_number: int
    line: str
    step: int | None
    baseline: float
    peak: float
    points: int = 0


class LossSpikeDetector:
    def __init__(self) -> None:
        self._window: deque[float] = deque(maxlen=BASELINE_POINTS)
        self._candidate: _Candidate | None = None
        self._points = 0
        """Loss points seen so far (for how recent the last recovered jump is)."""
        self._recovered_at = -NAN_AFTER_SPIKE_POINTS - 1
        self.spikes: list[Spike] = []
        self.recovered: list[Spike] = []
        self._max_scale = 0.0
        self._bad_grads: list[tuple[int, float, str]] = []
        """The current run of points with a non-finite gradient norm: (line, step, text)."""
        self._grad_window: deque[float] = deque(maxlen=GRAD_BASELINE_POINTS)
        self._exploded: tuple[int, float, str] | None = None
        """The first point of the current run whose finite gradient norm exploded: (line, step, text)."""
        self._exploded_points = 0
        self._exploded_peak = 0.0

    @property
    def failed(self) -> Spike | None:
        """The first spike that did not recover, if any."""
        return next((s for s in self.spikes if not s.recovered), None)

    def _baseline(self) -> float | None:
        if not self._window or (len(self._window) < SHORT_BASELINE and self._window[0] <= 0):
            return None
        return _median(self._window)

    def _threshold(self, baseline: float) -> float:
        size = len(self._window)
        ratio = JUMP_RATIO if size >= MIN_BASELINE else SHORT_JUMP_RATIO if size >= SHORT_BASELINE else SINGLE_JUMP_RATIO
        return max(baseline * ratio, baseline + JUMP_ABSOLUTE)

    def observe(self, lines: Sequence[int], steps: Sequence[float], losses: Sequence[float | None],
                scales: Sequence[float], line_text: Callable[[int], str],
                grad_norms: Sequence[float | None] = ()) -> None:
        """Take a batch of points; a loss or gradient norm of None means the line had none.

        A batch is read as its points would be one by one, wherever the batches fall (a
        pasted log is one batch, a long one a batch per buffer or sample): it is taken at
        once only when no point of it could be a spike, else point by point."""
        if self.failed is not None:
            return
        present = [x for x in losses if x is not None]
        finite = [x for x in present if math.isfinite(x)]
        norms = [g for g in grad_norms if g is not None]
        finite_scales = [x for x in scales if math.isfinite(x)]
        if self._calm(present, finite, norms, finite_scales):
            self._window.extend(finite[-BASELINE_POINTS:])
            self._points += len(finite)
            self._grad_window.extend(norms[-GRAD_BASELINE_POINTS:])
            if finite_scales:
                self._max_scale = max(self._max_scale, max(finite_scales))
            return
        for i, (line, step, loss) in enumerate(zip(lines, steps, losses, strict=True)):
            self._check_scale(lines[i:i + 1], scales[i:i + 1], line_text)
            if grad_norms:
                self._check_grads(lines[i:i + 1], steps[i:i + 1], grad_norms[i:i + 1], line_text)
            if self.failed is None:
                self._point(line, step, loss, line_text)
            if self.failed is not None:
                return

    def _calm(self, present: Sequence[float], finite: Sequence[float], norms: Sequence[float],
              scales: Sequence[float]) -> bool:
        """No point of the batch could start a spike, read one by one: no loss could cross
        the threshold that point by point would compute (the median only moves within the
        lowest value seen, and the ratio only falls to JUMP_RATIO), no gradient norm the
        limit (_calm_grad_limit), no loss scale collapsed, nothing non-finite, nothing pending."""
        if self._candidate is not None or len(finite) != len(present):
            return False
        if scales and min(scales) <= COLLAPSED_LOSS_SCALE:
            return False
        if self._bad_grads or self._exploded is not None or not all(math.isfinite(g) for g in norms):
            return False
        if norms and max(norms) >= self._calm_grad_limit(norms):
            return False
        if self._baseline() is None:
            # no baseline yet: calm only while this batch cannot complete one either
            return len(self._window) + len(finite) <= 1
        low = min(min(self._window), min(finite, default=math.inf))
        return not finite or max(finite) <= max(low * JUMP_RATIO, low + JUMP_ABSOLUTE)

    def _point(self, line: int, step: float, loss: float | None, line_text: Callable[[int], str]) -> None:
        if loss is None:
            return
        self._points += 1
        step_id = _step_id(step)
        cand = self._candidate
        if not math.isfinite(loss):
            if cand is not None:  # it jumped first, then went NaN: the jump is where it began
                self.spikes.append(Spike("nan", cand.line_number, cand.line, cand.step, cand.baseline, cand.peak))
                self._candidate = None
                return
            jump = self.recovered[-1] if self.recovered else None
            if (jump is not None and self._points - self._recovered_at <= NAN_AFTER_SPIKE_POINTS
                    and jump.baseline and (jump.peak or 0) >= jump.baseline * NAN_AFTER_SPIKE_RATIO):
                # so did a jump far above the baseline that came back just before
                self.spikes.append(Spike("nan", jump.line_number, jump.line, jump.step, jump.baseline, jump.peak))
                return
            self.spikes.append(Spike("nan", line, line_text(line), step_id, self._baseline(), None))
            return
        if cand is not None:
            cand.points += 1
            cand.peak = max(cand.peak, loss)
            if loss <= cand.baseline * RECOVERED_RATIO:
                self.recovered.append(Spike("diverged", cand.line_number, cand.line, cand.step,
                                            cand.baseline, cand.peak, recovered=True))
                self._recovered_at = self._points
                self._candidate = None
            elif cand.points >= SUSTAIN_POINTS:
                self._confirm()
            return
        baseline = self._baseline()
        if baseline is not None and loss > self._threshold(baseline):
            self._candidate = _Candidate(line, line_text(line), step_id, baseline, loss)
        else:
            self._window.append(loss)

    def _confirm(self) -> None:
        cand = self._candidate
        assert cand is not None
        self.spikes.append(Spike("diverged", cand.line_number, cand.line, cand.step, cand.baseline, cand.peak))
        self._candidate = None

    def _check_scale(self, lines: Sequence[int], scales: Sequence[float], line_text: Callable[[int], str]) -> None:
        finite = [s for s in scales if math.isfinite(s)]
        if not finite:
            return
        self._max_scale = max(self._max_scale, max(finite))
        if self._max_scale >= HEALTHY_LOSS_SCALE and min(finite) <= COLLAPSED_LOSS_SCALE:
            i = next(i for i, s in enumerate(scales) if math.isfinite(s) and s <= COLLAPSED_LOSS_SCALE)
            self.spikes.append(Spike("loss_scale", lines[i], line_text(lines[i]), None, self._max_scale, scales[i]))

    def _grad_limit(self) -> float:
        """The finite gradient norm from which a point counts as exploded."""
        if len(self._grad_window) < GRAD_MIN_BASELINE:
            return GRAD_EXPLODED
        return min(GRAD_EXPLODED, _median(self._grad_window) * GRAD_JUMP_RATIO)

    def _calm_grad_limit(self, present: Sequence[float]) -> float:
        """The lowest limit that any point of this batch could meet point by point: the
        window reaches its minimum size within the batch, its median no lower than the
        lowest norm seen."""
        if len(self._grad_window) + len(present) - 1 < GRAD_MIN_BASELINE:
            return GRAD_EXPLODED
        low = min(min(self._grad_window, default=math.inf), min(present))
        return min(GRAD_EXPLODED, low * GRAD_JUMP_RATIO, self._grad_limit())

    def _check_grads(self, lines: Sequence[int], steps: Sequence[float], grad_norms: Sequence[float | None],
                     line_text: Callable[[int], str]) -> None:
        # one point at a time (observe takes a calm batch at once, _calm)
        for line, step, norm in zip(lines, steps, grad_norms, strict=True):
            if norm is None:
                continue  # this line gives no gradient norm
            if math.isfinite(norm):
                self._bad_grads.clear()
                if norm < self._grad_limit():
                    self._exploded, self._exploded_points = None, 0  # back down: it recovered
                    self._grad_window.append(norm)
                    continue
                if self._exploded is None:
                    self._exploded, self._exploded_peak = (line, step, line_text(line)), norm
                self._exploded_points += 1
                self._exploded_peak = max(self._exploded_peak, norm)
                continue
            if self._exploded is not None:  # it exploded first, then went NaN/inf: the explosion is where it began
                self._bad_grads = [self._exploded]
                self._exploded, self._exploded_points = None, 0
            self._bad_grads.append((line, step, line_text(line)))
            if len(self._bad_grads) >= NAN_GRAD_POINTS:
                self._nan_grads()
                return

    def _nan_grads(self) -> None:
        """The run of NaN/inf gradient norms is a spike from its first point."""
        first, first_step, text = self._bad_grads[0]
        self.spikes.append(Spike("nan", first, text, _step_id(first_step), self._baseline(), None))

    def finish(self) -> None:
        """At the end of the log: a jump still up after a few points counts as diverged, and
        so does a jump to SHORT_JUMP_RATIO times the baseline that the log ends on (a pasted
        excerpt stops where the trouble is); so does a gradient norm that is NaN/inf on the
        last points that report one, fewer than NAN_GRAD_POINTS of them (the step where an
        ms-swift run's accuracy fell from 0.64 to 0.26 and the poster stopped)."""
        if self.failed is not None:
            return
        if self._bad_grads:
            self._nan_grads()
            return
        cand = self._candidate
        if cand is not None and (cand.points >= END_SUSTAIN_POINTS or cand.peak >= cand.baseline * SHORT_JUMP_RATIO):
            self._confirm()
            return
        if self._exploded is not None and self._exploded_points >= 2:
            # the log ends on exploded norms (one alone may be a blip): clipping kept the loss
            # finite, the run is diverging; a loss spike of its own, checked above, comes first
            first, first_step, text = self._exploded
            baseline = _median(self._grad_window) if self._grad_window else None
            self.spikes.append(Spike("grad_norm", first, text, _step_id(first_step), baseline, self._exploded_peak))


def _median(values: Iterable[float]) -> float:
    """The upper median (of an even count, the higher middle value): no averaging of two."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _step_id(step: float) -> int | None:
    return None if math.isnan(step) else int(step)
