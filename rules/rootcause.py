"""Choosing the root cause among errors that appear together.

Several errors usually appear at once: an ECC error on one rank, NCCL watchdog timeouts on
hundreds of others, SIGTERMs, `ChildFailedError` boxes, Slurm's summary. The first error
line and the last one are both usually wrong. The policy, in order:

1. Evidence over position. Each diagnosis rule has a tier saying how strongly its line
   explains a failure: hardware > network > device > cause > generic > symptom. A device,
   hardware or network fault on one rank explains collective timeouts and remote errors
   on the others, so the highest tier present wins, wherever it appears.
2. Context lines (`frame #3: ...`, the torchrun box's fields) never win. The box's
   "Root Cause (first observed failure)" is the first local worker that exited on that
   node: a victim, matched by symptom rules.
3. Python exception chains: an exception raised "from" another, or while handling it
   ("The above exception was the direct cause...", "During handling of the above
   exception..."), is a consequence; the exception it chains from is preferred.
4. Within a tier, the earliest failure in time: by time stamp when the candidates come
   from different files (ranks or nodes write their own), else by order of arrival.
5. Nothing matched: the reason is `unknown`; the classifier never guesses silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rules.classifier import RuleEvidence, earlier
from rules.model import TIER_RANK, DiagnosisRule, Evidence, Tier

_CONFIDENCE = {
    Tier.HARDWARE: 0.95, Tier.NETWORK: 0.9, Tier.DEVICE: 0.85, Tier.CAUSE: 0.9,
    Tier.GENERIC: 0.65, Tier.SYMPTOM: 0.5, Tier.CONTEXT: 0.0,
}
AMBIGUITY_PENALTY = 0.1
"""Taken off when another reason of the same tier competes for the root cause."""


@dataclass(frozen=True, slots=True)
class RootCause:
    evidence: Evidence
    rule: DiagnosisRule
    confidence: float
    count: int
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OtherError:
    reason: str
    line: str
    line_number: int
    count: int
    rule_id: str
    source: str
    survived: bool = False
    """The job trained on past it (rules.job.SURVIVED_STEPS): seen, not why it ended."""


def _candidates(found: Mapping[str, RuleEvidence]) -> list[Evidence]:
    items = [e for rf in found.values() if rf.rule.tier is not Tier.CONTEXT
             for e in ([rf.earliest] if rf.earliest else []) + rf.items]
    matched = {e.seq for e in items}
    # a consequence in an exception chain gives way to the exception it came from
    return [e for e in items if e.chained_from is None or e.chained_from not in matched]


def _earliest(items: list[Evidence]) -> Evidence:
    best = items[0]
    for item in items[1:]:
        if earlier(item, best):
            best = item
    return best


def choose_root_cause(found: Mapping[str, RuleEvidence]) -> tuple[RootCause | None, list[OtherError]]:
    """The root cause (None when no rule matched) and the other errors, strongest first."""
    candidates = _candidates(found)
    if not candidates:
        return None, []
    top = max(TIER_RANK[e.tier] for e in candidates)
    winner = _earliest([e for e in candidates if TIER_RANK[e.tier] == top])
    rule_found = found[winner.rule_id]
    rivals = {e.reason for e in candidates if TIER_RANK[e.tier] == top} - {winner.reason}
    confidence = _CONFIDENCE[winner.tier] - (AMBIGUITY_PENALTY if rivals else 0.0)
    root = RootCause(
        evidence=winner, rule=rule_found.rule, confidence=round(confidence, 2), count=rule_found.count,
        nodes=tuple(sorted(rule_found.nodes)), ranks=tuple(sorted(rule_found.ranks)),
    )
    return root, _other_errors(found, winner)


def _other_errors(found: Mapping[str, RuleEvidence], winner: Evidence) -> list[OtherError]:
    by_reason: dict[str, OtherError] = {}
    order: dict[str, tuple[int, int]] = {}
    for rf in found.values():
        first = rf.earliest
        if rf.rule.tier is Tier.CONTEXT or first is None:
            continue
        count = rf.count - (1 if rf.rule.id == winner.rule_id else 0)
        if count <= 0:
            continue
        if rf.rule.id == winner.rule_id:
            first = next((e for e in rf.items if e.seq != winner.seq), first)
        known = by_reason.get(rf.rule.reason)
        if known is None or first.seq < order[rf.rule.reason][1]:
            total = count + (known.count if known else 0)
            by_reason[rf.rule.reason] = OtherError(rf.rule.reason, first.line, first.line_number, total,
                                                   rf.rule.id, first.source)
            order[rf.rule.reason] = (-TIER_RANK[rf.rule.tier], first.seq)
        else:
            by_reason[rf.rule.reason] = OtherError(known.reason, known.line, known.line_number,
                                                   known.count + count, known.rule_id, known.source)
    return [by_reason[r] for r in sorted(by_reason, key=lambda r: order[r])]
