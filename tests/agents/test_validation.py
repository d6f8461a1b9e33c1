"""Every validation check rejects what it is there to reject."""

from __future__ import annotations

import time

import pytest

from agents.validation import Validator, load_error_corpus

SEGMENT = [
    f"I0811 21:54:{10 + i:02d}.531340 138304841739136 metric_logger.py:226] completed step: {i}, "
    f"seconds: {0.6 + i / 10:.3f}, loss: {12.9 - i / 10:.3f}" for i in range(6)
]
GOOD = (r"I\d+ +\d\d:\d\d:\d\d(?:[.,]\d+)? +\d+ +metric_logger\.py:\d+\] +completed +step: +(?P<step>\d+), "
        r"+seconds: +\d+(?:\.\d+)?, +loss: +(?P<loss>\d+(?:\.\d+)?)")


@pytest.fixture(scope="module")
def validator() -> Validator:
    return Validator(evidence=["RuntimeError: CUDA error: an illegal memory access was encountered"])


def test_a_good_pattern_passes_every_check(validator: Validator) -> None:
    result = validator.validate(GOOD, segment=SEGMENT, claims=range(6))
    assert result.ok, result.to_dict()
    assert [c.name for c in result.checks] == ["syntax", "line_bounded", "bounded_time", "claims", "no_error_lines",
                                               "no_corpus_lines", "not_over_general", "no_evidence_lines",
                                               "keeps_progress"]
    assert result.covers == frozenset(range(6))


@pytest.mark.parametrize(("pattern", "check"), [
    pytest.param("", "syntax", id="empty"),
    pytest.param("completed step: (\\d+", "syntax", id="does-not-compile"),
    pytest.param("I(?=0)\\d+ .*", "syntax", id="look-around-is-not-re2"),
    pytest.param("(\\w+) \\1", "syntax", id="back-reference"),
    pytest.param("step (?P<secret>\\d+)", "syntax", id="group-that-is-not-a-progress-field"),
    pytest.param("x" * 3000, "syntax", id="too-long"),
    pytest.param("I\\d+\\s+.*", "line_bounded", id="backslash-s"),
    pytest.param("I[^x]+", "line_bounded", id="negated-class"),
    pytest.param("(?s)I.*", "line_bounded", id="dotall"),
    pytest.param("(a+)+$", "bounded_time", id="nested-quantifier"),
    pytest.param("I(\\d+)*\\d+ .*", "bounded_time", id="nested-star"),
    pytest.param("I(?:\\w|\\d)*(?:\\w|\\d)*(?:\\w|\\d)*(?:\\w|\\d)*!", "bounded_time", id="overlapping-alternation"),
    pytest.param("completed step: 1, seconds", "claims", id="does-not-match-its-lines"),
    pytest.param(GOOD.replace("(?P<step>\\d+)", "(?P<step>[0-2])"), "claims", id="matches-too-few"),
    pytest.param(GOOD.replace("(?P<loss>", "("), "keeps_progress", id="drops-the-loss-unread"),
])
def test_each_check_rejects(validator: Validator, pattern: str, check: str) -> None:
    result = validator.validate(pattern, segment=SEGMENT, claims=range(6))
    assert not result.ok
    assert result.failed == [check], result.to_dict()


def test_a_rule_that_reads_only_part_of_a_loss_series_is_rejected(validator: Validator) -> None:
    # litgpt: the line of each optimizer step says so; a rule for the other lines alone would
    # leave those unread once it reads the source's progress
    segment = [f"iter {1151 + i} step {144 + i // 8}: loss {1.7 + i / 100:.4f}, iter time: 1106.53ms"
               + (" (optimizer.step)" if i % 8 == 0 else "") for i in range(17)]
    pattern = r"iter +(?P<step>\d+) +step +\d+: +loss +(?P<loss>\d+(?:\.\d+)?), +iter +time: +\d+(?:\.\d+)?ms"
    claims = [i for i in range(17) if i % 8]
    assert validator.validate(pattern, segment=segment, claims=claims).failed == ["keeps_progress"]
    whole = pattern + r"(?: +\(optimizer\.step\))?"
    assert validator.validate(whole, segment=segment, claims=range(17)).ok
    # a loss line with no step (a run's closing summary) is not part of the series
    summary = "{'train_runtime': 1200.5, 'train_loss': 1.93}"
    result = validator.validate(whole, segment=[*segment, summary], claims=range(17))
    assert result.ok, result.to_dict()


def test_claims_outside_the_segment_are_rejected(validator: Validator) -> None:
    result = validator.validate(GOOD, segment=SEGMENT, claims=[0, 1, 99])
    assert result.failed == ["claims"]


def test_a_pattern_that_matches_an_error_line_of_the_segment_is_rejected(validator: Validator) -> None:
    pattern = r"I\d+ +\d\d:\d\d:\d\d(?:[.,]\d+)? +\d+ +metric_logger\.py:\d+\] +[a-z]+:? .*"
    segment = [*SEGMENT, "I0811 21:55:00.1 13830 metric_logger.py:226] aborted: heartbeat FAILED on host 3"]
    result = validator.validate(pattern, segment=segment, claims=range(6))
    assert result.failed == ["no_error_lines"]
    result = validator.validate(GOOD.replace("completed +step", "[a-z]+ +step"), segment=SEGMENT, claims=range(6),
                                errors=["I0811 21:55:00.1 13830 metric_logger.py:226] retried step: 4, seconds: 1.0, loss: 9"])
    assert result.failed == ["no_error_lines"]


def test_a_pattern_that_matches_a_corpus_error_line_is_rejected(validator: Validator) -> None:
    corpus_line = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    assert corpus_line in load_error_corpus()
    segment = [f"RuntimeStats: GPU memory: {i} GiB in use" for i in range(4)]
    result = validator.validate(r"Runtime[A-Za-z]+: [A-Z]+ [a-z]+.*", segment=segment, claims=range(4))
    assert result.failed == ["no_corpus_lines"]


@pytest.mark.parametrize("pattern", [
    pytest.param(".*", id="dot-star"),
    pytest.param("\\S+ \\S+ \\S+ \\S+ \\S+ \\S+.*", id="any-six-words"),
    pytest.param("[A-Za-z0-9 :,.\\[\\]_/=()-]*", id="any-printable"),
])
def test_over_general_patterns_are_rejected(pattern: str) -> None:
    result = Validator(corpus=[]).validate(pattern, segment=SEGMENT, claims=range(6))
    assert result.failed == ["not_over_general"], result.to_dict()


def test_a_pattern_that_filters_much_of_a_held_out_sample_is_rejected() -> None:
    held_out = [f"[helix 22:40:{i:02d}.000 trn-a1/r00] step {i} done" for i in range(5)] + ["something else"] * 5
    segment = [f"[helix 22:41:{i:02d}.000 trn-b2/r03] step {i} done" for i in range(5)]
    pattern = r"\[helix \d\d:\d\d:\d\d\.\d+ [\w.-]+/r\d+\] step \d+ done"
    assert Validator(corpus=[], held_out=[]).validate(pattern, segment=segment, claims=range(5)).ok
    result = Validator(corpus=[], held_out=held_out).validate(pattern, segment=segment, claims=range(5))
    assert result.failed == ["not_over_general"]


def test_a_pattern_with_too_little_literal_text_is_rejected() -> None:
    segment = [f"{i} {i * 2}.5 {i * 3}" for i in range(5)]
    result = Validator(corpus=[]).validate(r"\d+ \d+\.\d+ \d+", segment=segment, claims=range(5))
    assert result.failed == ["not_over_general"]


def test_a_pattern_that_matches_classifier_evidence_is_rejected(validator: Validator) -> None:
    segment = [f"RuntimeInfo: CUDA context {i} ready" for i in range(4)]
    pattern = r"Runtime(?:Info|Error): CUDA (?:context \d+ ready|error: an illegal memory access was encountered)"
    result = validator.validate(pattern, segment=segment, claims=range(4),
                                evidence=["RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert result.failed == ["no_evidence_lines"]


def test_a_catastrophic_pattern_costs_bounded_time(validator: Validator) -> None:
    """Not a timing assertion on speed: the check must come back at all (no runaway backtracking)."""
    start = time.perf_counter()
    result = validator.validate("I(\\d|\\d)*\\d*x", segment=SEGMENT)
    assert result.failed in (["bounded_time"], ["claims"])
    assert time.perf_counter() - start < 30


def test_corpus_file_is_read_when_present(tmp_path) -> None:
    path = tmp_path / "error_lines.jsonl"
    path.write_text('{"line": "HELIX-E042 allreduce stalled", "reason": "hang", "source": "x"}\nnot json\n')
    assert "HELIX-E042 allreduce stalled" in load_error_corpus(path)
    assert load_error_corpus(tmp_path / "missing.jsonl")  # the seed remains
