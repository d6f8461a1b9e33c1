"""Segments: what survives the filter, cut into pieces the Log Agent works on.

A segment closes when it holds `max_lines` lines or `max_bytes` bytes, or, in live mode,
when its oldest line has waited `max_age_s` seconds (a job that prints slowly still gets
its rules learned). Error-like lines ride along separately: they are never mined, but every
proposal is checked against them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rules.model import KeptLine


@dataclass(frozen=True)
class Segment:
    seq: int
    lines: tuple[KeptLine, ...]
    """Lines that are not error-like: what rules may be learned from."""
    errors: tuple[KeptLine, ...] = ()
    """Error-like lines of the same stretch of the log."""

    @property
    def first_line(self) -> int:
        return min((line.line_number for line in self.lines), default=0)

    @property
    def last_line(self) -> int:
        return max((line.line_number for line in self.lines), default=0)

    @property
    def sources(self) -> list[str]:
        return sorted({line.source for line in self.lines})


@dataclass
class Segmenter:
    max_lines: int = 256
    max_bytes: int = 64 << 10
    max_age_s: float = 30.0
    clock: Callable[[], float] = time.time
    """Wall clock: a live job's open segment may be resumed in another process."""
    _lines: list[KeptLine] = field(default_factory=list)
    _errors: list[KeptLine] = field(default_factory=list)
    _bytes: int = 0
    _opened_at: float | None = None
    _seq: int = 0

    def __post_init__(self) -> None:
        if self.max_lines < 1:
            raise ValueError(f"max_lines must be at least 1, got {self.max_lines}")
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {self.max_bytes}")
        if self.max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {self.max_age_s}")

    def add(self, lines: Iterable[KeptLine]) -> list[Segment]:
        """Take kept lines in order; return the segments they closed."""
        out: list[Segment] = []
        for line in lines:
            if line.error_like:
                self._errors.append(line)
                continue
            if self._opened_at is None:
                self._opened_at = self.clock()
            self._lines.append(line)
            self._bytes += len(line.text) + 1
            if len(self._lines) >= self.max_lines or self._bytes >= self.max_bytes:
                out.append(self._close())
        if self._lines and self._opened_at is not None and self.clock() - self._opened_at >= self.max_age_s:
            out.append(self._close())
        return out

    def flush(self) -> Segment | None:
        """The open segment, closed early (end of the log); None when it is empty."""
        return self._close() if self._lines else None

    @property
    def pending(self) -> int:
        return len(self._lines)

    def _close(self) -> Segment:
        self._seq += 1
        segment = Segment(self._seq, tuple(self._lines), tuple(self._errors))
        self._lines, self._errors, self._bytes, self._opened_at = [], [], 0, None
        return segment
