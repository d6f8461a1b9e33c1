"""The vote is a pure function: same proposals, same decision, whatever their order."""

from __future__ import annotations

import itertools

import pytest

from agents.voting import Proposal, normalize, quorum_for, specificity, vote


def p(voter: int, pattern: str, covers: set[int]) -> Proposal:
    return Proposal(voter, pattern, frozenset(covers))


@pytest.mark.parametrize(("k", "agreement", "expected"), [(5, 0.5, 3), (4, 0.5, 3), (1, 0.5, 1), (3, 1.0, 3), (7, 0.3, 3)])
def test_quorum(k: int, agreement: float, expected: int) -> None:
    assert quorum_for(k, agreement) == expected


@pytest.mark.parametrize(("k", "agreement"), [(0, 0.5), (5, 0.0), (5, 1.5)])
def test_quorum_refuses_nonsense(k: int, agreement: float) -> None:
    with pytest.raises(ValueError):
        quorum_for(k, agreement)


def test_equivalent_patterns_normalise_to_one_text() -> None:
    assert normalize(r"step (?P<step>[0-9]+)") == normalize(r"^step (?:\d+)$") == normalize(r"step \d+") == r"step \d+"
    assert normalize(r"a(?:b)c") == "abc"


def test_specificity_counts_required_literals() -> None:
    assert specificity(r"completed step: \d+") > specificity(r"\S+ step: \d+") > specificity(r".*")


def test_majority_wins_and_minority_loses() -> None:
    proposals = [p(v, r"step \d+", {0, 1, 2}) for v in range(3)] + [p(3, r"step 1", {1})]
    decision = vote(proposals, k=5)
    assert [c.pattern for c in decision.accepted] == [r"step \d+"]
    assert decision.accepted[0].votes == 3
    assert [c.pattern for c in decision.below_quorum] == ["step 1"]


def test_patterns_that_cover_the_same_lines_pool_their_votes() -> None:
    proposals = [p(0, r"step \d+", {0, 1}), p(1, r"step [0-9]+", {0, 1}), p(2, r"step (?P<step>\d+)", {0, 1})]
    decision = vote(proposals, k=5)
    (winner,) = decision.accepted
    assert winner.votes == 3
    assert winner.pattern == r"step (?P<step>\d+)"  # the variant with a progress capture is kept


def test_a_voter_counts_once() -> None:
    proposals = [p(0, r"a \d+", {0, 1}), p(0, r"a [0-9]+", {0, 1}), p(1, r"a \d+", {0, 1})]
    assert vote(proposals, k=5).accepted == ()


def test_over_merged_candidate_loses_to_better_supported_parts() -> None:
    proposals = [p(v, r"ckpt save \d+", {0, 1, 2}) for v in range(4)]
    proposals += [p(v, r"ckpt done \d+", {3, 4, 5}) for v in range(4)]
    proposals += [p(v, r"ckpt \S+ \d+", {0, 1, 2, 3, 4, 5}) for v in (4, 0, 1)]
    decision = vote(proposals, k=5)
    assert sorted(c.pattern for c in decision.accepted) == [r"ckpt done \d+", r"ckpt save \d+"]
    assert [c.pattern for c in decision.lost] == [r"ckpt \S+ \d+"]


def test_tie_is_broken_by_the_judge_or_by_coverage() -> None:
    proposals = [p(v, r"eval loss=\S+", {0, 1, 2, 3}) for v in range(3)]
    proposals += [p(v, r"eval loss=\d+\.\d+", {0, 1, 2}) for v in range(2, 5)]
    default = vote(proposals, k=5)
    assert [c.pattern for c in default.accepted] == [r"eval loss=\S+"]
    assert default.tie_breaks == ("coverage",)
    judged = vote(proposals, k=5, judge=lambda group: 1)
    assert [c.pattern for c in judged.accepted] == [r"eval loss=\d+\.\d+"]
    assert judged.tie_breaks == ("judge",)
    ignored = vote(proposals, k=5, judge=lambda group: 7)  # an out-of-range answer changes nothing
    assert [c.pattern for c in ignored.accepted] == [r"eval loss=\S+"]


def test_decision_does_not_depend_on_reply_order() -> None:
    proposals = [p(0, "a", {0, 1}), p(1, "a", {0, 1}), p(2, "b", {1, 2}), p(3, "b", {1, 2}),
                 p(4, "c", {3, 4}), p(0, "c", {3, 4}), p(2, "c", {3, 4})]
    outcomes = {tuple(c.pattern for c in vote(list(order), k=5, agreement=0.3).accepted)
                for order in itertools.permutations(proposals, len(proposals)) if order[0].voter in (0, 2)}
    assert len(outcomes) == 1


def test_proposals_covering_nothing_are_ignored() -> None:
    assert vote([p(v, ".*", set()) for v in range(5)], k=5).accepted == ()
