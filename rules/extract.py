"""Reading progress fields (step, loss, ...) out of the metric lines a filter rule drops.

The fast way is one `findall` over a whole run of metric lines, which stays in C. Python's
`re` finds its matches quickly only when the pattern starts with a literal, so the extractor
searches with the rule's pattern from its first literal run on (for a Megatron iteration
rule, from `iteration` on, skipping the optional time stamp before it). If the number of
matches is not exactly the number of metric lines in the run, the extractor falls back to
matching line by line with the whole, anchored pattern.
"""

from __future__ import annotations

import re
from functools import cached_property, partial
from collections.abc import Sequence

from rules.envelope import ENVELOPE_PATTERN
from rules.linear import NotLinear, compile_linear, findall_bytes
from rules.model import PROGRESS_FIELDS

_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")
_LITERAL = re.compile(r"[A-Za-z0-9_ :=/-]")
MIN_LITERAL_RUN = 4

Columns = list[Sequence[bytes | None]]


class FieldError(ValueError):
    """A pattern captures a field that is not a progress field."""


def progress_fields(pattern: str) -> tuple[str, ...]:
    """The progress fields a pattern captures; other group names are refused."""
    names = tuple(_NAMED_GROUP.findall(pattern))
    unknown = set(names) - PROGRESS_FIELDS
    if unknown:
        raise FieldError(f"unknown progress field(s) {sorted(unknown)} in {pattern[:80]!r}")
    return names


def non_capturing(pattern: str, *, keep_named: bool = False) -> str:
    """The pattern with every group (or every unnamed one) made non-capturing.

    RE2 leaves its DFA for a slower engine as soon as a caller asks for groups, and the
    Python binding always asks for all of them.
    """
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]" or (bool(out) and out[-1] in ("[", "[^"))
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif c == "(":
            if pattern.startswith("(?P<", i) and not keep_named:
                out.append("(?:")
                i = pattern.index(">", i) + 1
                continue
            if not pattern.startswith("(?", i):
                out.append("(?:")
                i += 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def literal_suffix(pattern: str) -> str | None:
    """The pattern from its first top-level run of literal characters on, when that run
    comes before the first named group; None when there is no such run, or when a top-level
    alternation makes a suffix mean something else."""
    if _has_top_level_bar(pattern):
        return None
    first_group = pattern.find("(?P<")
    depth, i, in_class, run_start = 0, 0, False, -1
    while i < len(pattern) and (first_group < 0 or i < first_group):
        c = pattern[i]
        if c == "\\":
            run_start = -1
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class, run_start = True, -1
        elif c in "()":
            depth += 1 if c == "(" else -1
            run_start = -1
        elif depth == 0 and _LITERAL.match(c) and not pattern.startswith(("*", "+", "?", "{"), i + 1):
            if run_start < 0:
                run_start = i
            if i + 1 - run_start >= MIN_LITERAL_RUN:
                return pattern[run_start:]
        else:
            run_start = -1
        i += 1
    return None


def _has_top_level_bar(pattern: str) -> bool:
    depth, i, in_class = 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


class FieldExtractor:
    """Reads the progress fields of one metric rule."""

    def __init__(self, pattern: str, *, trusted: bool):
        self.fields = progress_fields(pattern)
        self.sampled = "checkpoint_step" not in self.fields
        """Dense metric lines may be sampled; checkpoint lines are rare and all of them count."""
        if not self.fields:
            self._match = self._findall = None
            return  # a rule that reads nothing needs no reader (most rules: a third of start-up)
        body = non_capturing(pattern, keep_named=True)
        anchored = ("^%s(?:%s)$" % (ENVELOPE_PATTERN, body)).encode("latin-1")
        suffix = literal_suffix(body)
        search = suffix.encode("latin-1") if suffix else None
        if trusted:
            # The packs' own patterns, reviewed here: Python `re` reads their groups about
            # three times faster than RE2 does (tests keep them free of nested quantifiers).
            # Compiled on first use (the properties below): a log meets the metric lines of
            # one or two packs, and compiling all 26 readers was 0.15 s of every start.
            self._sources = (anchored, search)
        else:
            # A learned or imported pattern runs in RE2 only: linear in the line, whatever it says.
            try:
                self._match = compile_linear(anchored, latin1=True).match
                finder = compile_linear(search, latin1=True) if search else None
                self._findall = partial(findall_bytes, finder) if finder is not None else None
            except NotLinear as exc:
                raise FieldError(str(exc)) from None

    @cached_property
    def _match(self):
        return re.compile(self._sources[0]).match

    @cached_property
    def _findall(self):
        search = self._sources[1]
        return re.compile(search).findall if search else None

    def columns(self, data: bytes, start: int, stop: int,
                line_numbers: Sequence[int], first_line: int) -> tuple[list[int], Columns]:
        """Field values of the metric lines in data[start:stop].

        `line_numbers` are the metric lines' numbers (the span may interleave other rules'
        lines) and `first_line` is the number of the span's first line. Returns the line
        numbers that matched and one column of raw values per field.
        """
        if self._findall is not None:
            rows = self._findall(data, start, stop)
            if len(rows) == len(line_numbers):
                return list(line_numbers), self._transpose(rows)
        lines = data[start:stop].split(b"\n")
        matches = [self._match(lines[n - first_line]) for n in line_numbers]
        numbers = [n for n, m in zip(line_numbers, matches, strict=True) if m is not None]
        return numbers, self._transpose([m.groups() for m in matches if m is not None])

    def columns_joined(self, joined: bytes, line_numbers: Sequence[int]) -> tuple[list[int], Columns]:
        """Field values of metric lines joined by newlines, one line per number."""
        if self._findall is not None:
            rows = self._findall(joined, 0, len(joined))
            if len(rows) == len(line_numbers):
                return list(line_numbers), self._transpose(rows)
        return self.columns_of(joined.split(b"\n"), line_numbers)

    def columns_of(self, lines: Sequence[bytes], line_numbers: Sequence[int]) -> tuple[list[int], Columns]:
        """Field values of the given lines (each without its newline)."""
        matches = [self._match(line) for line in lines]
        numbers = [n for n, m in zip(line_numbers, matches, strict=True) if m is not None]
        return numbers, self._transpose([m.groups() for m in matches if m is not None])

    def _transpose(self, rows: list) -> Columns:
        if not rows:
            return [[] for _ in self.fields]
        if len(self.fields) == 1 and not isinstance(rows[0], tuple):
            return [rows]
        return [list(col) for col in zip(*rows, strict=True)]
