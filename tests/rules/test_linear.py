"""Every rule pattern runs in linear time (RE2), whatever its source; a pattern that needs a
backtracking engine is refused with the feature named."""

from __future__ import annotations

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.validation import validate_diagnosis_rule
from rules.classifier import DiagnosisCompileError, DiagnosisProgram
from rules.extract import FieldError, FieldExtractor
from rules.filters import FilterCompileError, FilterProgram
from rules.guard import ErrorGuard
from rules.linear import NotLinear, backtracking_feature, compile_linear, search_groups
from rules.model import Action, DiagnosisRule, FilterRule, Origin, Tier

# Shapes that backtrack badly in Python's engines behind a literal prefix (the prefix got them
# past the old adversarial check, and each matching line then cost a 50 ms timeout).
SLOW_SHAPES = {  # pattern: a line it matches
    r"tickle (a|a)*b": "tickle aab", r"tickle (a|aa)+b": "tickle aaab", r"tickle (a*)*b": "tickle ab",
    r"tickle (a+)+b": "tickle aab", r"tickle (\w|a)*b": "tickle a1b", r"tickle (?:a|ab)*c": "tickle abac",
    r"tickle (a?){25}a{25}": "tickle " + "a" * 25, r"tickle (.*a){12}": "tickle " + "xa" * 12,
    r"tickle (\d+\s?)+x": "tickle 1 2x", r"tickle ([a-z]+)*=": "tickle abc=", r"tickle (a|a?)+b": "tickle ab",
}


def rule(pattern: str, source: str = "import") -> DiagnosisRule:
    return DiagnosisRule("custom.tickle", "runtime_error", Tier.CAUSE, (pattern,), Origin.USER,
                         Action.RESTART if hasattr(Action, "RESTART") else list(Action)[0], source=source)


@pytest.mark.parametrize(("pattern", "feature"), [
    (r"tickle (?=a)a", "lookahead"),
    (r"tickle (?<!x)a", "negative lookahead or lookbehind"),
    (r"tickle (a)\1", "backreference"),
    (r"tickle (?P<x>a)(?P=x)", "backreference"),
    (r"tickle (a)?(?(1)b|c)", "conditional group"),
    (r"tickle (?>ab)c", "atomic group"),
    (r"tickle a++b", "possessive quantifier"),
])
def test_a_backtracking_feature_is_refused_by_name_everywhere(pattern: str, feature: str) -> None:
    assert feature in backtracking_feature(pattern)
    with pytest.raises(DiagnosisCompileError, match=feature):
        DiagnosisProgram([rule(pattern)])
    with pytest.raises(FilterCompileError, match=feature):
        FilterProgram([FilterRule("f", pattern, trusted=False)], ErrorGuard())
    validation = validate_diagnosis_rule(rule(pattern), examples=["tickle ab"])
    assert not validation.ok and validation.failed == ["syntax"]
    assert feature in validation.checks[0].detail


@pytest.mark.parametrize("pattern", [r"tickle a\Z", r"tickle (unclosed"])
def test_what_re2_cannot_parse_is_refused_with_its_message(pattern: str) -> None:
    with pytest.raises(NotLinear, match="RE2 cannot compile it"):
        compile_linear(pattern)


def test_plain_patterns_have_no_backtracking_feature() -> None:
    for pattern in [*SLOW_SHAPES, r"NCCL error.*(?P<host>[\w.-]+):\d+", r"(?i)cuda error: (?:an )?illegal"]:
        assert backtracking_feature(pattern) is None


@pytest.mark.parametrize(("pattern", "example"), SLOW_SHAPES.items())
def test_slow_shapes_are_accepted_and_answered_in_linear_time(pattern: str, example: str) -> None:
    """Accepted, because RE2 runs them linearly: 2,000 lines built to make a backtracking
    engine explode are answered (pytest-timeout fails the test if one hangs; the old path
    took 50 ms a line, 100 s here)."""
    assert validate_diagnosis_rule(rule(pattern), examples=[example]).ok
    program = DiagnosisProgram([rule(pattern)])
    runs_of_a_match = example.endswith("a")  # `(.*a){12}` matches a long run of a's; `(a|a)*b` does not
    for n in range(2000):
        assert (program.match("tickle " + "a" * (2000 + n) + "!") is not None) == runs_of_a_match
    found = program.match(example)
    assert found is not None and found[1]["match"] == example
    # the groups were read by RE2 (each reader is compiled when a line first needs it)
    assert all(isinstance(reader.__self__, re2._Regexp) for reader in program._readers)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab=! 01xtickle", max_size=400))
def test_groups_read_by_re2_are_the_groups_python_reads(text: str) -> None:
    """RE2 reads a rule's groups as Python's engine does on the lines it matches."""
    import re

    pattern = r"tickle (?P<word>[a-z]+)=(?P<value>\d+)"
    program = DiagnosisProgram([rule(pattern, source="builtin")])
    got = program.match(text)
    want = re.search(pattern, text)
    assert (got is None) == (want is None)
    if want:
        assert got[1] == {**want.groupdict(), "match": want.group(0)}


def test_learned_progress_fields_are_read_by_re2() -> None:
    extractor = FieldExtractor(r"tickle step (?P<step>\d+) (a|a)*b", trusted=False)
    assert isinstance(extractor._match.__self__, re2._Regexp)
    data = b"tickle step 12 aab\n" + (b"tickle step 13 " + b"a" * 50_000 + b"!\n")
    numbers, columns = extractor.columns_of(data.split(b"\n")[:2], [1, 2])
    assert numbers == [1] and columns == [[b"12"]]
    with pytest.raises(FieldError, match="backreference"):
        FieldExtractor(r"tickle step (?P<step>\d+) (a)\1", trusted=False)


def test_findall_bytes_gives_what_the_bindings_findall_gives() -> None:
    """The fast reader of metric lines is the binding's findall without its match objects:
    same values for no, one and several groups, groups that do not take part, empty matches
    and a window inside the data."""
    import random

    from rules.linear import compile_linear, findall_bytes

    rng = random.Random(7)
    alphabet = b"ab x\nloss: 1.5 step 3 nan"
    for pattern in (rb"loss: ([\d.]+)", rb"(a)|(b)", rb"x*", rb"step (\d+) loss ([\d.]+|nan)", rb"loss"):
        regexp = compile_linear(pattern, latin1=True)
        for _ in range(200):
            data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
            start = rng.randint(0, len(data))
            stop = rng.randint(start, len(data))
            assert findall_bytes(regexp, data, start, stop) == regexp.findall(data, start, stop), (pattern, data)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("steploss:=' 0123456789.nanifNaN_/{}|ü完\t-")), max_size=60))
def test_search_groups_reads_the_same_groups_as_the_binding(text: str) -> None:
    """The spans read on the text's UTF-8 bytes give what the binding's own search gives
    (non-ASCII text included: the spans are byte offsets there, characters here)."""
    from rules.sniff import GRAD_NORM, LOSS_LINE

    for regexp in (LOSS_LINE, GRAD_NORM):
        found = regexp.search(text)
        assert search_groups(regexp, text) == (None if found is None else found.groups(None))


_PIECES = st.sampled_from([
    "a", "b", ".", r"\w", r"\d", r"\s", "[ab]", "(a|aa)", "(a|a)", "(a*)", "(a+)", "(?:a|ab)", "(.*a)", "(a?)",
    r"(\w|a)", "(a)", r"\1", "(?=a)", "(?!b)", "(?<=a)", "(?>a)", "a++", "(?(1)a|b)", "(?P<n>a)", "(?P=n)",
])
_QUANTIFIERS = st.sampled_from(["", "*", "+", "?", "{2,5}", "{12}", "*?", "+?"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PIECES, _QUANTIFIERS), min_size=1, max_size=6))
def test_any_pattern_is_refused_or_runs_in_re2(parts: list[tuple[str, str]]) -> None:
    """Whatever a pattern is made of (the shapes that make backtracking engines explode, and
    the features only they have): it is refused, or it runs in RE2 alone (linear in the
    line), every reader of it, on lines built to be adversarial."""
    pattern = "tickle " + "".join(piece + quantifier for piece, quantifier in parts)
    try:
        program = DiagnosisProgram([rule(pattern)])
    except DiagnosisCompileError:
        return  # refused: named by feature, or RE2 cannot parse it
    for line in ("tickle " + "a" * 3000 + "!", "tickle " + "ab" * 1500, "tickle " + "a" * 3000, "tickle "):
        program.match(line)
    # every reader a line needed was RE2's (each is compiled when a line first needs it)
    assert all(reader is None or isinstance(reader.__self__, re2._Regexp) for reader in program._readers)
