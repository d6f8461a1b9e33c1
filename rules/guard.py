"""The error guard: finds the lines that look like errors, so no filter rule can drop them.

The guard runs over every byte of the log, ahead of the filter. Hyperscan's SIMD literal
matcher does that at several GB/s, about five times what a DFA pass costs, so it is the
engine of choice; RE2 is the fallback where the Hyperscan wheel is not available.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import re2

from rules.disk_cache import derived_json

try:  # the wheel is x86-64/aarch64 Linux and macOS only
    import hyperscan

    from rules import hyperscan_cache
except ImportError:  # pragma: no cover - exercised where the wheel is missing
    hyperscan = None

ERROR_LIKE_FILE = Path(__file__).parent / "packs" / "error_like.yaml"


@dataclass(frozen=True, slots=True)
class GuardPattern:
    pattern: str
    caseless: bool = False


def load_guard_patterns(path: Path = ERROR_LIKE_FILE) -> list[GuardPattern]:
    """The error-like patterns, kept parsed in the cache directory (rules.disk_cache)."""
    def parse() -> list[dict]:
        import yaml  # only when the cache misses: a short command's start parses no YAML

        from rules.packs import SAFE_LOADER

        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
        return [{"pattern": p["pattern"], "caseless": bool(p.get("caseless", False))} for p in data["patterns"]]

    return [GuardPattern(**row) for row in derived_json("guard-patterns", [path, Path(__file__)], parse)]


def _line_spans(data: bytes, offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Whole-line spans [start, end) containing the given offsets, sorted and distinct."""
    spans: list[tuple[int, int]] = []
    rfind, find, size = data.rfind, data.find, len(data)
    last_end = -1
    for off in sorted(offsets):
        if off < last_end:
            continue
        start = rfind(b"\n", 0, off) + 1
        end = find(b"\n", off)
        end = size if end < 0 else end + 1
        spans.append((start, end))
        last_end = end
    return spans


class ErrorGuard:
    """Finds error-like lines in a buffer of whole lines."""

    def __init__(self, patterns: Sequence[GuardPattern] | None = None, *, engine: str = "auto"):
        self.patterns = list(patterns) if patterns is not None else load_guard_patterns()
        if engine == "auto":
            engine = "hyperscan" if hyperscan is not None else "re2"
        self.engine = engine
        if engine == "hyperscan":
            self._db = self._compile_hyperscan()
            # a scratch space serves one scan at a time: each thread (concurrent requests in
            # the server's thread pool) gets its own, or Hyperscan raises ScratchInUseError
            self._scratch = threading.local()
        elif engine == "re2":
            self._re2 = self._compile_re2()
        else:
            raise ValueError(f"guard engine must be 'auto', 'hyperscan' or 're2', got {engine!r}")

    def _compile_hyperscan(self):
        if hyperscan is None:
            raise ValueError("guard engine 'hyperscan' requested but the hyperscan package is missing")
        flags = [hyperscan.HS_FLAG_CASELESS if p.caseless else 0 for p in self.patterns]
        return hyperscan_cache.database([p.pattern.encode() for p in self.patterns], flags)

    def _compile_re2(self):
        opts = re2.Options()
        opts.encoding = re2.Options.Encoding.LATIN1
        opts.never_capture = True
        opts.log_errors = False
        alternation = "|".join(("(?i:%s)" if p.caseless else "(?:%s)") % p.pattern for p in self.patterns)
        return re2.compile(alternation.encode("latin-1"), opts)._regexp

    def error_line_spans(self, data: bytes) -> list[tuple[int, int]]:
        """Spans [start, end) of the error-like lines in `data` (whole lines), in order."""
        offsets: list[int] = []
        if self.engine == "hyperscan":
            def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                offsets.append(end - 1 if end > 0 else 0)
            scratch = getattr(self._scratch, "space", None)
            if scratch is None:
                scratch = self._scratch.space = hyperscan.Scratch(self._db)
            self._db.scan(data, match_event_handler=on_match, scratch=scratch)
        else:
            offsets = self._scan_re2(data)
        return _line_spans(data, offsets)

    def _scan_re2(self, data: bytes) -> list[int]:
        offsets: list[int] = []
        pos, size = 0, len(data)
        unanchored = re2._Anchor.UNANCHORED
        while pos < size:
            start, end = self._re2.Match(unanchored, data, pos, size)[0]
            if start < 0:
                break
            offsets.append(start)
            nl = data.find(b"\n", end if end > start else start)
            pos = size if nl < 0 else nl + 1  # one hit per line is enough
        return offsets

    def is_error_like(self, line: str | bytes) -> bool:
        data = line.encode("utf-8", "replace") if isinstance(line, str) else line
        return bool(self.error_line_spans(data))
