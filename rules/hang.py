"""When a silent job counts as stalled: the threshold adapts to the job.

DLRover's hang detector raised false alarms on evaluation phases and on the first steps
(compilation, data index building), which are slow but not stuck. So the threshold is the
largest of: a configured floor; k times the job's median time per step; and 1.5 times the
longest pause between progress reports the job has already survived (an evaluation every
N steps teaches the detector how long evaluations take). Before the first progress report
the job is starting up, and only output silence counts, against twice the floor.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

GAP_MARGIN = 1.5
STARTUP_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class Silence:
    seconds: float
    threshold: float
    since: str
    """`progress` (no new step) or `output` (no line at all)."""


def report_periods(steps: Sequence[float], step_seconds: Sequence[float]) -> list[float]:
    """Seconds between consecutive progress reports, from the job's own step times.

    A job logs every `--log-interval` steps (1 to 100 in practice), so silence must be
    measured against the time between reports, not the time of one step: 20 x 1.5 s would
    call a Megatron job with a 50-step interval stalled between every two of its lines.
    Points without a step or a step time (NaN) are skipped.
    """
    periods = []
    previous = math.nan
    for step, seconds in zip(steps, step_seconds, strict=True):
        if not math.isnan(step):
            if not math.isnan(previous) and step > previous and math.isfinite(seconds) and seconds > 0:
                periods.append((step - previous) * seconds)
            previous = step
    return periods


def threshold(*, floor_s: float, factor: float, step_seconds: Sequence[float], longest_gap_s: float) -> float:
    median = statistics.median(step_seconds) if step_seconds else 0.0
    return max(floor_s, factor * median, GAP_MARGIN * longest_gap_s)


def silence(*, now: float, started_at: float, last_output_at: float | None, last_progress_at: float | None,
            floor_s: float, factor: float, step_seconds: Sequence[float], longest_gap_s: float) -> Silence | None:
    """The silence that makes the job stalled, or None while it is within bounds."""
    if last_progress_at is None:
        quiet = now - (last_output_at or started_at)
        limit = STARTUP_FACTOR * floor_s
        return Silence(quiet, limit, "output") if quiet > limit else None
    limit = threshold(floor_s=floor_s, factor=factor, step_seconds=step_seconds, longest_gap_s=longest_gap_s)
    quiet = now - last_progress_at
    return Silence(quiet, limit, "progress") if quiet > limit else None
