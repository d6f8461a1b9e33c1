"""Segments close on lines, bytes, and (live mode) age."""

from __future__ import annotations

import pytest

from agents.segments import Segmenter
from rules.model import KeptLine


def lines(n: int, start: int = 1, text: str = "x", error: bool = False) -> list[KeptLine]:
    return [KeptLine(start + i, f"{text} {start + i}", error, "a.log") for i in range(n)]


def test_closes_on_line_count_and_keeps_errors_aside() -> None:
    seg = Segmenter(max_lines=4, max_bytes=10_000, max_age_s=60)
    out = seg.add([*lines(3), *lines(1, 4, "Traceback", error=True), *lines(3, 5)])
    assert len(out) == 1
    assert [line.line_number for line in out[0].lines] == [1, 2, 3, 5]
    assert [line.line_number for line in out[0].errors] == [4]
    assert (out[0].first_line, out[0].last_line) == (1, 5)
    assert seg.pending == 2
    assert [line.line_number for line in seg.flush().lines] == [6, 7]
    assert seg.flush() is None


def test_closes_on_bytes() -> None:
    seg = Segmenter(max_lines=1000, max_bytes=50, max_age_s=60)
    out = seg.add(lines(10, text="x" * 20))
    assert len(out) == 3 and all(len(s.lines) == 3 for s in out)  # 23 bytes a line


def test_closes_on_age_in_live_mode() -> None:
    now = [0.0]
    seg = Segmenter(max_lines=1000, max_bytes=10_000, max_age_s=30, clock=lambda: now[0])
    assert seg.add(lines(2)) == []
    now[0] = 31.0
    (out,) = seg.add(lines(1, 3))
    assert len(out.lines) == 3


@pytest.mark.parametrize("kwargs", [{"max_lines": 0}, {"max_bytes": 0}, {"max_age_s": 0}])
def test_refuses_bad_bounds(kwargs) -> None:
    with pytest.raises(ValueError):
        Segmenter(**kwargs)
