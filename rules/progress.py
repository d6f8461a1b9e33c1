"""How far a job got: the progress fields that metric rules read from the lines they drop.

Values arrive in batches (one per run of metric lines) and are stored in columns, because a
Python object per metric line costs more than the filter spends on the line itself.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rules.anomaly import LossSpikeDetector
from rules.model import ProgressPoint
from rules.sniff import bare_loss, grad_norm_field, loss_fields

LineText = Callable[[int], str]


def _no_text(_line: int) -> str:
    return ""


RECENT_POINTS = 4096
"""Points kept exactly; older ones are thinned by halves, so memory stays flat."""

BARE_NAN_POINTS = 2
"""Bare value lines in a row that read NaN/inf before they count as a NaN loss: one alone may
be any number printed while debugging; a loss printed every step that turned NaN repeats."""
_COLUMNS = ("step", "loss", "grad_norm", "step_time_s", "loss_scale")
NAN = math.nan


def _number(raw: bytes | str | None) -> float:
    if raw is None:
        return NAN
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    text = text.strip().replace(",", "").rstrip("%")
    try:
        return float(text)
    except ValueError:
        return NAN


def _column(values: Sequence[bytes | None]) -> list[float]:
    try:
        return list(map(float, values))  # the common case, at C speed
    except (TypeError, ValueError):
        if not any(values):  # a field this format never prints (step time in s when it gives ms)
            return [NAN] * len(values)
        return [_number(v) for v in values]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    line_number: int
    source: str = ""


def _non_finite(raw: str | None) -> bool:
    """A value printed as NaN or inf (sniffed values are numbers: rules.sniff._NUMBER)."""
    return raw is not None and not math.isfinite(_number(raw))


def _maybe(value: float) -> float | None:
    return None if math.isnan(value) else value


class ProgressTracker:
    """Last values, a bounded curve of (step, loss, grad norm, step time, loss scale), and
    the checkpoints saved, for one job."""

    def __init__(self, source: str = ""):
        self.source = source
        self.points_seen = 0
        self.last_line: tuple[int, str] | None = None
        """The first line of the newest step seen: (line number, text)."""
        self._last_line_step: float | None = None
        self.spikes = LossSpikeDetector()
        self._cols = {name: array("d") for name in _COLUMNS}
        self._lines = array("q")
        self.checkpoints: deque[Checkpoint] = deque(maxlen=256)
        self._sniffed = 0
        """Points read from kept lines (rules.sniff) rather than from a filter rule's fields."""
        self._kept: list[tuple[tuple[str, ...], int, list[bytes], str]] = []
        """Points sniffed from kept lines, not yet read: (fields, line, raw values, text)."""
        self._bare_finite = False
        """A bare value line (rules.sniff.bare_loss) with a finite value was seen."""
        self._bare_nans: list[tuple[int, str, str | None, str]] = []
        """The current run of bare value lines that read NaN/inf: (line, text, step, value)."""

    def observe(self, fields: Sequence[str], line_numbers: Sequence[int],
                columns: Sequence[Sequence[bytes | None]], line_text: LineText = _no_text) -> None:
        """Take a batch of raw values: one column per field, one row per metric line.

        `line_text(n)` gives the text of metric line n while the batch is being read; it is
        called for the last line of the batch and for lines where the loss spikes.
        """
        rows = len(line_numbers)
        if not rows:
            return
        raw = dict(zip(fields, columns, strict=True))
        if "checkpoint_step" in raw:
            self._checkpoints(line_numbers, raw.pop("checkpoint_step"))
        if "step" not in raw and "loss" not in raw:
            return
        values = {name: _column(raw[name]) if name in raw else [NAN] * rows for name in _COLUMNS}
        if "step_time_ms" in raw:
            ms = _column(raw["step_time_ms"])
            values["step_time_s"] = [m / 1000.0 if math.isnan(s) else s
                                     for s, m in zip(values["step_time_s"], ms, strict=True)]
        for name, column in self._cols.items():
            column.extend(values[name])
        self._lines.extend(line_numbers)
        self.points_seen += rows
        self._note_last_line(line_numbers, values["step"], line_text)
        if "loss" in raw:
            losses: Sequence[float | None] = values["loss"]
            if None in raw["loss"]:
                losses = [None if r is None else f for r, f in zip(raw["loss"], values["loss"], strict=True)]
            grads: Sequence[float | None] = ()
            if "grad_norm" in raw and any(raw["grad_norm"]):
                grads = [None if not r else f for r, f in zip(raw["grad_norm"], values["grad_norm"], strict=True)]
            self.spikes.observe(line_numbers, values["step"], losses, values["loss_scale"], line_text, grads)
        if len(self._lines) > 2 * RECENT_POINTS:
            self._thin()

    def observe_kept(self, line_number: int, text: str) -> None:
        """A kept line that may report a loss in a format no filter rule reads. Read only
        while no filter rule has read this source's progress (a pack's own fields are better,
        and another kind of loss in its kept lines would only mix series), except for a NaN
        or inf: a rule, learned or built in, that reads a metric line's numbers does not match
        the same line with `nan` in their place, and that line is the one that matters.

        The point is read at the next flush_kept(), with the others of its buffer: one
        observe() per kept metric line was most of the cost of a log whose every line is
        kept (the spike detector reads a batch as it would read its points one by one)."""
        found = loss_fields(text)
        if found is None:
            if not (self.points_seen or self._kept):  # a named loss, when there is one, is the series
                self._observe_bare(line_number, text)
            return
        step, loss = found
        read = {"step": step, "loss": loss, "grad_norm": grad_norm_field(text)}
        if self.points_seen > self._sniffed and not (_non_finite(loss) or _non_finite(read["grad_norm"])):
            return
        fields = tuple(name for name, value in read.items() if value is not None)
        self._kept.append((fields, line_number, [read[name].encode() for name in fields], text))

    def flush_kept(self) -> None:
        """Read the points sniffed since the last flush, in order, one batch per run of
        points with the same fields."""
        rows, self._kept = self._kept, []
        start = 0
        while start < len(rows):
            fields = rows[start][0]
            stop = start + 1
            while stop < len(rows) and rows[stop][0] == fields:
                stop += 1
            group = rows[start:stop]
            texts = {number: text for _, number, _, text in group}
            self._sniffed += len(group)
            self.observe(fields, [number for _, number, _, _ in group],
                         [[values[i] for _, _, values, _ in group] for i in range(len(fields))], texts.__getitem__)
            start = stop

    def _observe_bare(self, line_number: int, text: str) -> None:
        """A bare `step value` line or a printed scalar tensor (rules.sniff.bare_loss), in a
        source where nothing else reported a loss: a loss only when its series had a finite
        value and then turns NaN/inf for BARE_NAN_POINTS lines in a row; the first of those
        is the point read."""
        found = bare_loss(text)
        if found is None:
            return
        step, value = found
        if not _non_finite(value):
            self._bare_finite, self._bare_nans = True, []
            return
        if not self._bare_finite:
            return
        self._bare_nans.append((line_number, text, step, value))
        if len(self._bare_nans) == BARE_NAN_POINTS:
            first, first_text, first_step, first_value = self._bare_nans[0]
            if first_step is None:
                self._kept.append((("loss",), first, [first_value.encode()], first_text))
            else:
                self._kept.append((("step", "loss"), first, [first_step.encode(), first_value.encode()], first_text))

    def _note_last_line(self, line_numbers: Sequence[int], steps: Sequence[float], line_text: LineText) -> None:
        """The first line that reported the newest step: with every rank printing the same
        step, rank 0's line, not whichever rank happened to print last."""
        finite = [s for s in steps if not math.isnan(s)]
        if not finite:
            self.last_line = (line_numbers[-1], line_text(line_numbers[-1]))
            self._last_line_step = None
            return
        top = max(finite)
        if self._last_line_step is not None and top <= self._last_line_step:
            return
        first = next(n for n, s in zip(line_numbers, steps, strict=True) if s == top)
        self.last_line = (first, line_text(first))
        self._last_line_step = top

    def add_checkpoints(self, line_numbers: Sequence[int], raw: Sequence[bytes | None]) -> None:
        """Checkpoint saves read late (lines kept before the rule that reads them was
        learned): merged in line order with those read already, each line once."""
        known = {c.line_number: c for c in self.checkpoints}
        for line, step in zip(line_numbers, _column(raw), strict=True):
            if not math.isnan(step):
                known.setdefault(line, Checkpoint(int(step), line, self.source))
        self.checkpoints = deque(sorted(known.values(), key=lambda c: c.line_number), maxlen=self.checkpoints.maxlen)

    def _checkpoints(self, line_numbers: Sequence[int], raw: Sequence[bytes | None]) -> None:
        for line, step in zip(line_numbers, _column(raw), strict=True):
            if not math.isnan(step):
                self.checkpoints.append(Checkpoint(int(step), line, self.source))

    def _thin(self) -> None:
        """Halve the resolution of everything older than the most recent points."""
        cut = len(self._lines) - RECENT_POINTS
        for name, column in self._cols.items():
            self._cols[name] = column[:cut:2] + column[cut:]
        self._lines = self._lines[:cut:2] + self._lines[cut:]

    def __len__(self) -> int:
        return len(self._lines)

    def steps_after(self, line_number: int) -> int:
        """How many new training steps this source reported after line `line_number`:
        distinct steps above any reported up to that line (a point without a step counts
        once). Thinned older points can only make it smaller, never larger."""
        steps, lines = self._cols["step"], self._lines
        before = max((s for s, n in zip(steps, lines, strict=True) if n <= line_number and not math.isnan(s)),
                     default=-math.inf)
        later = [s for s, n in zip(steps, lines, strict=True) if n > line_number]
        return len({s for s in later if s > before}) + sum(1 for s in later if math.isnan(s))

    def recent(self, name: str, count: int) -> list[float]:
        """The last `count` values of one column (`step`, `loss`, `step_time_s`, ...); NaN
        where a point had no value."""
        return list(self._cols[name][-count:])

    def _last(self, name: str) -> float | None:
        column = self._cols[name]
        for value in reversed(column[-64:]):
            if not math.isnan(value):
                return value
        return None

    @property
    def last_step(self) -> int | None:
        steps = [s for s in self._cols["step"][-64:] if not math.isnan(s)]
        return int(max(steps)) if steps else None

    @property
    def last_loss(self) -> float | None:
        return self._last("loss")

    def curve(self) -> list[ProgressPoint]:
        """The stored points, oldest first (older ones thinned)."""
        cols = self._cols
        return [
            ProgressPoint(step=None if math.isnan(s) else int(s), loss=_maybe(lo), grad_norm=_maybe(g),
                          step_time_s=_maybe(t), loss_scale=_maybe(sc), line_number=ln, source=self.source)
            for s, lo, g, t, sc, ln in zip(cols["step"], cols["loss"], cols["grad_norm"],
                                           cols["step_time_s"], cols["loss_scale"], self._lines, strict=True)
        ]

    def summary(self) -> dict[str, float | int | None]:
        last_loss = self.last_loss
        return {
            "last_step": self.last_step,
            "last_loss": None if last_loss is None else round(last_loss, 6),
            "last_grad_norm": self._last("grad_norm"),
            "last_step_time_s": self._last("step_time_s"),
        }
