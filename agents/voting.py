"""Self-consistency: K independent proposals per segment, then a vote. Pure functions.

Proposals agree when they are the same rule *on the evidence*: patterns are first put in a
canonical form (group names, `[0-9]` vs `\\d`, redundant groups), and two proposals whose
patterns match exactly the same lines of the segment are one candidate, whatever their
text. A candidate's votes are the number of distinct voters (K runs) behind it; it wins
when it reaches the quorum. Candidates that overlap (cover some of the same lines) compete:
the one with more votes wins (the other survives only if most of its lines are still
unexplained); equal votes are a tie, which a judge may break (an LLM call,
injected as a function) or, without a judge, the larger coverage then the more specific
pattern wins, so the outcome never depends on the order of the replies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Proposal:
    """One rule proposed by one voter, with the segment lines its pattern matches."""

    voter: int
    pattern: str
    covers: frozenset[int]
    """Indexes of the segment lines the pattern matches (computed by the caller)."""
    claims: frozenset[int] = frozenset()
    """Indexes the proposer said the pattern is meant to cover."""
    fields: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Candidate:
    """Equivalent proposals pooled: same coverage of the segment."""

    covers: frozenset[int]
    voters: frozenset[int]
    patterns: tuple[str, ...]
    """Distinct patterns, best first: most voters, then most specific, then text order."""
    proposals: tuple[Proposal, ...] = field(repr=False, default=())

    @property
    def votes(self) -> int:
        return len(self.voters)

    @property
    def pattern(self) -> str:
        return self.patterns[0]


@dataclass(frozen=True)
class Decision:
    accepted: tuple[Candidate, ...]
    below_quorum: tuple[Candidate, ...]
    lost: tuple[Candidate, ...]
    """Reached the quorum but overlapped a better candidate."""
    ties: tuple[tuple[Candidate, ...], ...] = ()
    """Groups of equal-vote overlapping candidates, and how each was broken, in `tie_breaks`."""
    tie_breaks: tuple[str, ...] = ()
    quorum: int = 1


Judge = Callable[[Sequence[Candidate]], int | None]
"""Picks one of tied candidates by index, or None to leave it to the default order."""

_NAMED = re.compile(r"\(\?P<\w+>")
_DIGIT_CLASS = re.compile(r"\[0-9\]")
_REDUNDANT = re.compile(r"\(\?:([^()|]*)\)(?![*+?{])")
"""A non-capturing group around a plain sequence, not repeated: the group changes nothing."""


def normalize(pattern: str) -> str:
    """Canonical text of a pattern: what differs here does not change what it matches."""
    text = pattern.strip()
    text = text.removeprefix("^").removesuffix("$") if not text.endswith("\\$") else text.removeprefix("^")
    text = _NAMED.sub("(?:", text)
    text = _DIGIT_CLASS.sub(r"\\d", text)
    previous = None
    while previous != text:
        previous = text
        text = _REDUNDANT.sub(r"\1", text)
    return text


def specificity(pattern: str) -> int:
    """Literal characters a pattern requires; more is more specific (ties in the vote)."""
    text = re.sub(r"\\.", "x", pattern)          # an escaped char is one literal
    text = re.sub(r"\[[^\]]*\]", "", text)        # classes are not literals
    text = re.sub(r"[().*+?{}|^$\d,]", "", text)
    return len(text)


def quorum_for(k: int, agreement: float = 0.5) -> int:
    """Votes needed out of k: a strict majority by default (3 of 5), at least 1."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not 0.0 < agreement <= 1.0:
        raise ValueError(f"agreement must be in (0, 1], got {agreement}")
    return max(1, min(k, math.floor(k * agreement) + 1 if agreement < 1.0 else k))


def pool(proposals: Sequence[Proposal]) -> list[Candidate]:
    """Group proposals by coverage; proposals covering nothing are dropped."""
    groups: dict[frozenset[int], list[Proposal]] = {}
    for proposal in proposals:
        if proposal.covers:
            groups.setdefault(proposal.covers, []).append(proposal)
    out = []
    for covers, members in groups.items():
        by_text: dict[str, set[int]] = {}
        original: dict[str, str] = {}
        for p in members:
            key = normalize(p.pattern)
            by_text.setdefault(key, set()).add(p.voter)
            # keep the variant with captures if any voter gave one (progress fields)
            if key not in original or p.pattern.count("(?P<") > original[key].count("(?P<"):
                original[key] = p.pattern
        ranked = sorted(by_text, key=lambda t: (-len(by_text[t]), -specificity(t), t))
        out.append(Candidate(covers=covers, voters=frozenset(p.voter for p in members),
                             patterns=tuple(original[t] for t in ranked), proposals=tuple(members)))
    return out


def _rank(c: Candidate) -> tuple:
    return (-c.votes, -len(c.covers), -specificity(normalize(c.pattern)), normalize(c.pattern))


def vote(proposals: Sequence[Proposal], *, k: int, agreement: float = 0.5,
         judge: Judge | None = None) -> Decision:
    """Decide which proposed rules win. Pure: same proposals, same decision."""
    quorum = quorum_for(k, agreement)
    candidates = sorted(pool(proposals), key=_rank)
    eligible = [c for c in candidates if c.votes >= quorum]
    below = tuple(c for c in candidates if c.votes < quorum)
    accepted: list[Candidate] = []
    lost: list[Candidate] = []
    ties: list[tuple[Candidate, ...]] = []
    breaks: list[str] = []
    remaining = list(eligible)
    while remaining:
        best = remaining[0]
        rivals = [c for c in remaining[1:] if c.votes == best.votes and c.covers & best.covers]
        if rivals:
            group = (best, *rivals)
            ties.append(group)
            choice = judge(group) if judge is not None else None
            if choice is not None and 0 <= choice < len(group):
                best = group[choice]
                breaks.append("judge")
            else:
                breaks.append("coverage")
        accepted.append(best)
        covered = frozenset().union(*(c.covers for c in accepted))
        rest = []
        for c in remaining:
            if c is best:
                continue
            # an overlapping candidate survives only when it mostly explains other lines
            (rest if 2 * len(c.covers - covered) > len(c.covers) else lost).append(c)
        remaining = rest
    return Decision(tuple(accepted), below, tuple(lost), tuple(ties), tuple(breaks), quorum)
