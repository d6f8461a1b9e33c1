"""line_language(): the filter's DFA compiles a cheaper pattern, which must match the same lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rules.envelope import split_envelope
from rules.builtin import builtin_filter_rules
from rules.simplify import line_language

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "logs"
PACK_RULES = builtin_filter_rules()
SIMPLIFIED = [r for r in PACK_RULES if line_language(r.pattern) != r.pattern]


def test_the_metric_rules_of_the_packs_are_simplified():
    # the rules whose optional field groups made the DFA slow; if a pack edit stops the
    # rewrite from applying, the filter silently loses half its speed
    ids = {r.id for r in SIMPLIFIED}
    assert {"megatron.iteration", "internevo.metrics", "torchtitan.step", "fairseq.train-inner"} <= ids
    megatron = next(r for r in PACK_RULES if r.id == "megatron.iteration")
    assert line_language(megatron.pattern).endswith(r"iteration[:=]? *(?P<step>\d+) ?/ *\d+ \|.*")


def _fixture_messages() -> list[str]:
    messages = set()
    for path in sorted(FIXTURES.rglob("*.log")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            messages.add(split_envelope(line).message)
    return sorted(messages)


MESSAGES = _fixture_messages()
PACK_LINES = {rule["id"]: [*rule.get("examples", []), *rule.get("counter_examples", [])]
              for path in sorted((ROOT / "rules" / "packs" / "filters").glob("*.yaml"))
              for rule in yaml.safe_load(path.read_text(encoding="utf-8"))["rules"]}


@pytest.mark.parametrize("rule", SIMPLIFIED, ids=lambda r: r.id)
def test_a_simplified_rule_matches_exactly_the_same_lines(rule):
    original, simple = re.compile(rule.pattern), re.compile(line_language(rule.pattern))
    lines = [split_envelope(line).message for line in PACK_LINES[rule.id]] + MESSAGES
    assert len(MESSAGES) > 1000
    differ = [line for line in lines if bool(original.fullmatch(line)) != bool(simple.fullmatch(line))]
    assert differ == []
    assert any(original.fullmatch(line) for line in lines)  # the check saw the rule's lines


@pytest.mark.parametrize(("pattern", "expected"), [
    (r"step (?P<step>\d+)(?: loss (?P<loss>[\d.]+))?.*", r"step (?P<step>\d+).*"),
    (r"a(?:b)?(?:c(?:d)?)?.*", r"a.*"),
    (r"a(?:[^'\n]*)?.*", r"a.*"),                  # a negated class that excludes the newline
    (r"a|b(?:c)?.*", r"a|b.*"),
    (r"a(?:\)x)?.*", r"a.*"),                      # an escaped parenthesis inside the group
    (r"a(?:[)])?.*", r"a.*"),                      # a parenthesis inside a class
])
def test_optional_groups_before_the_closing_dot_star_go(pattern, expected):
    assert line_language(pattern) == expected


@pytest.mark.parametrize("pattern", [
    r"a(?:\s+b)?.*",        # \s matches a newline
    r"a(?:[^']*)?.*",       # so does a negated class without \n
    r"a(?:\W)?.*",
    r"a(?:[\n])?.*",
    r"(?s)a(?:b)?.*",       # `.` matches newlines: .* no longer stays on the line
    r"a(?:b)?\.*",          # an escaped dot: literal dots, not any text
    r"a(?:b)+.*",           # not optional
    r"a(?:b)?.*x",          # something follows
    r"a(?:b)?",
    r"a\(?.*",              # the '?' makes an escaped '(' optional, no group
])
def test_anything_else_is_left_alone(pattern):
    assert line_language(pattern) == pattern


_ALPHABET = st.sampled_from(["a", "b", " ", "|", "1", ".", "\n", "x"])


@given(prefix=st.sampled_from(["a", r"a\d*", "a|b"]),
       groups=st.lists(st.sampled_from([r"(?: b)", r"(?:.*?x\d)", r"(?:[^|\n]*\|)", r"(?:\s)", r"(?:[^x]+)"]),
                       max_size=3),
       text=st.text(_ALPHABET, max_size=12))
def test_the_rewrite_never_changes_which_lines_match(prefix, groups, text):
    pattern = prefix + "".join(g + "?" for g in groups) + ".*"
    simple = line_language(pattern)
    for line in text.split("\n"):
        assert bool(re.fullmatch(pattern, line)) == bool(re.fullmatch(simple, line))
