"""The text that every match of a pattern contains: lets the filter count a rule's lines in
a stretch with bytes.count instead of matching them one by one (rules/filters.py, mixed runs)."""

from __future__ import annotations

import re
import re._constants as sre_c  # noqa: PLC2701
import re._parser as sre_parse  # noqa: PLC2701
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache

MIN_LITERAL_CHARS = 3
"""Shorter text (`: `, ` | `) would occur in other rules' lines as well: the count's check
would refuse it every time."""


@lru_cache(maxsize=4096)
def required_literals(pattern: str) -> tuple[bytes, ...]:
    """The runs of literal characters at the top level of the pattern's sequence (outside
    any alternation, repeat or optional group) of at least MIN_LITERAL_CHARS, longest first,
    as Latin-1 bytes (the filter's RE2 programs read bytes as Latin-1); none when the pattern
    ignores case or Python cannot parse it. Every match of the pattern holds each of them."""
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return ()
    if tree.state.flags & re.IGNORECASE:
        return ()
    runs: list[bytes] = []
    run: list[int] = []
    for op, av in [*_sequence(tree), (None, None)]:
        if op is sre_c.LITERAL and av < 256:
            run.append(av)
            continue
        if len(run) >= MIN_LITERAL_CHARS:
            runs.append(bytes(run))
        run = []
    return tuple(sorted(runs, key=len, reverse=True))


def distinct_literals(patterns: Sequence[str]) -> list[bytes | None]:
    """For each pattern, its longest required literal found in no other pattern's required
    literals (a format's common prefix, `[helix`, is in every rule's lines): the one most
    likely to occur in its own lines only. None where there is none."""
    all_runs = [required_literals(p) for p in patterns]
    out: list[bytes | None] = []
    for i, runs in enumerate(all_runs):
        others = [run for j, theirs in enumerate(all_runs) if j != i for run in theirs]
        out.append(next((lit for lit in runs if not any(lit in run or run in lit for run in others)), None))
    return out


def _sequence(tree: Iterable) -> Iterator[tuple]:
    """The items that every match runs through in order: a group's own items in its place
    (a group is not optional by itself), anything else as one item."""
    for op, av in tree:
        if op is sre_c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if not add_flags and not del_flags:
                yield from _sequence(sub)
                continue
        yield op, av
