"""The literals every match of a pattern holds (rules/literals.py), checked against matches."""

from __future__ import annotations

import re

import pytest

from rules.literals import distinct_literals, required_literals


@pytest.mark.parametrize(("pattern", "line"), [
    (r"\[helix [\d:.]+ r\d+\] step +(?P<step>\d+) \| loss (?P<loss>[\d.]+)", "[helix 1:2 r0] step   7 | loss 2.5"),
    (r"(?:warm)?up done in (\d+)s", "up done in 3s"),
    (r"a(?:bcd|xyz)efgh", "axyzefgh"),
])
def test_every_match_holds_each_literal(pattern: str, line: str) -> None:
    assert re.fullmatch(pattern, line)
    literals = required_literals(pattern)
    assert literals
    for literal in literals:
        assert literal.decode("latin-1") in line


def test_no_literal_where_a_match_may_lack_it() -> None:
    assert required_literals(r"abcd|efgh") == ()          # alternation at the top
    assert required_literals(r"(?:abcd)?efg") == (b"efg",)  # an optional group is not required
    assert required_literals(r"(?i)step done") == ()      # bytes.count is case-sensitive
    assert required_literals(r"(?i:step) done") == (b" done",)
    assert required_literals(r"([") == ()                 # Python cannot parse it: nothing claimed


def test_a_format_s_common_prefix_is_not_a_rule_s_own_literal() -> None:
    step, data, hb = r"\[helix \S+\] step \d+ \| tok/s \d+", r"\[helix \S+\] data: shard \d+", r"\[helix \S+\] hb"
    assert distinct_literals([step, data, hb]) == [b" | tok/s ", b"] data: shard ", b"] hb"]
    assert distinct_literals([r"\[helix \S+\] \w+", r"\[helix \S+\] \d+"]) == [None, None]
