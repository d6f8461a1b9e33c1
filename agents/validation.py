"""Validation of a proposed filter pattern before it is used. Every check can reject.

A learned rule drops lines, so a bad one hides what a person needs. Checks, in order:

1. `syntax`: short enough, compiles under `regex` and in the common subset of RE2 and Python
   syntax, and as a filter rule of the engine (RE2 run programs within their memory budget,
   named groups only for progress fields).
2. `line_bounded`: nothing in it can match a newline (`\\s`, `[^x]`, `(?s).`): the engine
   matches runs of lines with one program, and a rule must never span two lines.
3. `bounded_time`: no nested unbounded quantifier (`(a+)+`, star height above one), and a
   `regex` match with a timeout on adversarial inputs built from the pattern and its lines.
   In the hot path untrusted rules run only in RE2 (linear time), so this protects the places
   where Python evaluates them (progress-field extraction) and the validation itself.
4. `claims`: matches every line it claims, and at least `min_support` lines of the segment.
5. `no_error_lines`: matches no error-like line of the segment or the job so far.
6. `no_corpus_lines`: matches no line of the corpus of real error lines.
7. `not_over_general`: does not match the empty line or any of a set of unrelated probe
   lines, requires some literal text, and filters at most a small share of a held-out
   healthy sample of other formats.
8. `no_evidence_lines`: matches none of the classifier's evidence lines (diagnosis rule
   examples and the evidence found in this job).
9. `keeps_progress`: a rule that drops lines reporting a training loss (`rules.sniff`) reads
   that loss in a named group: a learned rule may change what is kept, never what the job's
   loss curve and its spikes say. And a rule that reads the loss covers every line of the
   segment that reports a loss at a step: once a rule reads a source's progress its kept
   lines are no longer read (rules.progress), so a series split between two shapes (litgpt
   marks every optimizer step's line with "(optimizer.step)") would lose the other shape's
   points, among them the last one before a spike.

Matching uses the engine's own semantics: the launcher envelope in front, anchored at both
ends, RE2 on the UTF-8 bytes (`FilterProgram.rules_matching`).
"""

from __future__ import annotations

import json
import re
import re._constants as sre_c  # noqa: PLC2701 - the parse tree is the only exact way to inspect a pattern
import re._parser as sre_parse  # noqa: PLC2701
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agents.samples import HELD_OUT_HEALTHY, OVER_GENERAL_PROBES, SEED_ERROR_LINES
from rules.envelope import ENVELOPE_PATTERN
from rules.extract import non_capturing
from rules.filters import FilterCompileError, FilterProgram
from rules.guard import ErrorGuard
from rules.model import FilterRule
from rules.sniff import loss_fields

CORPUS_FILE = Path(__file__).resolve().parent.parent / "rules" / "corpus" / "error_lines.jsonl"
MAX_PATTERN_CHARS = 2000
MATCH_TIMEOUT_S = 0.05
TIME_BUDGET_S = 0.25
"""Total `regex` time allowed over all adversarial inputs of one pattern."""
ADVERSARIAL_REPEAT = 3000
MIN_LITERAL_CHARS = 3
MAX_HELD_OUT_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Validation:
    pattern: str
    checks: tuple[Check, ...]
    covers: frozenset[int] = frozenset()
    """Segment lines the pattern matches (when it compiled)."""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, object]:
        return {c.name: ("ok" if c.ok else f"failed: {c.detail}") for c in self.checks}


def load_error_corpus(path: Path = CORPUS_FILE) -> list[str]:
    """Real error lines shipped with the project (`{"line", "reason", "source"}` per line),
    plus a small seed of our own; a missing or unreadable corpus file leaves the seed."""
    lines = list(SEED_ERROR_LINES)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return lines
    for raw in text.splitlines():
        try:
            item = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and isinstance(item.get("line"), str):
            lines.append(item["line"])
    return lines


# -- the parse tree --------------------------------------------------------------------------
_NL_CATEGORIES = {sre_c.CATEGORY_SPACE, sre_c.CATEGORY_NOT_DIGIT, sre_c.CATEGORY_NOT_WORD,
                  sre_c.CATEGORY_LINEBREAK, sre_c.CATEGORY_UNI_SPACE, sre_c.CATEGORY_UNI_NOT_DIGIT,
                  sre_c.CATEGORY_UNI_NOT_WORD, sre_c.CATEGORY_UNI_LINEBREAK}
_REPEATS = {sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", sre_c.MAX_REPEAT)}
_BIG = 16
"""A repeat that may run more than this many times counts as unbounded."""


def _class_has_newline(items: Sequence) -> bool:
    negate, hit = False, False
    for op, av in items:
        if op is sre_c.NEGATE:
            negate = True
        elif op is sre_c.LITERAL:
            hit |= av == 10
        elif op is sre_c.RANGE:
            hit |= av[0] <= 10 <= av[1]
        elif op is sre_c.CATEGORY:
            hit |= av in _NL_CATEGORIES
    return hit != negate


def _newline_node(tree: Iterable, dotall: bool) -> str | None:
    """The first construct that can match a newline, or None."""
    for op, av in tree:
        if op is sre_c.LITERAL and av == 10:
            return "a literal newline"
        if op is sre_c.NOT_LITERAL and av != 10:
            return "a negated character"
        if op is sre_c.ANY and dotall:
            return "'.' with the s flag"
        if op is sre_c.IN and _class_has_newline(av):
            return "a class that includes the newline (\\s, [^...], \\W, \\D)"
        for sub, flags in _children(op, av, dotall):
            found = _newline_node(sub, flags)
            if found:
                return found
    return None


def _children(op, av, dotall: bool) -> list[tuple[Iterable, bool]]:
    if op is sre_c.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        flag = (dotall or bool(add_flags & sre_c.SRE_FLAG_DOTALL)) and not del_flags & sre_c.SRE_FLAG_DOTALL
        return [(sub, flag)]
    if op in _REPEATS:
        return [(av[2], dotall)]
    if op is sre_c.BRANCH:
        return [(b, dotall) for b in av[1]]
    if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
        return [(av[1], dotall)]
    if op is getattr(sre_c, "ATOMIC_GROUP", None):
        return [(av, dotall)]
    return []


def _has_unbounded(tree: Iterable) -> bool:
    for op, av in tree:
        if op in _REPEATS and (av[1] is sre_c.MAXREPEAT or av[1] > _BIG):
            return True
        if any(_has_unbounded(sub) for sub, _ in _children(op, av, False)):
            return True
    return False


def _nested_quantifier(tree: Iterable) -> bool:
    """An unbounded repeat containing another unbounded repeat: `(a+)+`, `(\\w*\\s?)*`."""
    for op, av in tree:
        if op in _REPEATS and (av[1] is sre_c.MAXREPEAT or av[1] > _BIG) and _has_unbounded(av[2]):
            return True
        if any(_nested_quantifier(sub) for sub, _ in _children(op, av, False)):
            return True
    return False


def _literal_chars(tree: Iterable) -> int:
    """Alphanumeric literal characters every match must contain."""
    total = 0
    for op, av in tree:
        if op is sre_c.LITERAL and chr(av).isalnum():
            total += 1
        elif op is sre_c.SUBPATTERN:
            total += _literal_chars(av[3])
        elif op in _REPEATS and av[0] >= 1:
            total += _literal_chars(av[2])
        elif op is sre_c.BRANCH:
            total += min((_literal_chars(b) for b in av[1]), default=0)
    return total


def _chars_of(tree: Iterable, out: set[str]) -> None:
    """Characters the pattern mentions (literals, class samples): seeds for hostile input."""
    for op, av in tree:
        if op is sre_c.LITERAL:
            out.add(chr(av))
        elif op is sre_c.IN:
            for item_op, item in av:
                if item_op is sre_c.LITERAL:
                    out.add(chr(item))
                elif item_op is sre_c.RANGE:
                    out.add(chr(item[0]))
                elif item_op is sre_c.CATEGORY:
                    out.update({sre_c.CATEGORY_DIGIT: "0", sre_c.CATEGORY_WORD: "a",
                                sre_c.CATEGORY_SPACE: " "}.get(item, "x"))
        for sub, _ in _children(op, av, False):
            _chars_of(sub, out)


# -- the validator ---------------------------------------------------------------------------
@dataclass
class Validator:
    """Checks proposals against the lines of a job and the project's samples."""

    guard: ErrorGuard = field(default_factory=ErrorGuard)
    corpus: Sequence[str] = field(default_factory=load_error_corpus)
    held_out: Sequence[str] = field(default_factory=lambda: list(HELD_OUT_HEALTHY))
    evidence: Sequence[str] = ()
    """Lines the classifier's diagnosis rules are known to match (their examples)."""
    min_support: int = 3
    timeout_s: float = MATCH_TIMEOUT_S
    max_held_out_share: float = MAX_HELD_OUT_SHARE

    def __post_init__(self) -> None:
        if self.min_support < 1:
            raise ValueError(f"min_support must be at least 1, got {self.min_support}")
        self._corpus = [line.encode("utf-8", "replace") for line in self.corpus]
        self._held_out = [line.encode("utf-8", "replace") for line in self.held_out]
        self._evidence = [line.encode("utf-8", "replace") for line in self.evidence]

    def validate(self, pattern: str, *, segment: Sequence[str], claims: Iterable[int] = (),
                 errors: Sequence[str] = (), evidence: Sequence[str] = ()) -> Validation:
        """Run every check on `pattern`; stops at the first failure (later ones need it)."""
        checks: list[Check] = []
        program, tree, problem = self._compile(pattern)
        checks.append(Check("syntax", program is not None, problem))
        if program is None:
            return Validation(pattern, tuple(checks))
        steps = (
            lambda: self._line_bounded(tree),
            lambda: self._bounded_time(pattern, tree, segment, claims),
        )
        for step in steps:
            checks.append(step())
            if not checks[-1].ok:
                return Validation(pattern, tuple(checks))

        def matches(line: bytes) -> bool:
            return bool(program.rules_matching(line))

        seg = [line.encode("utf-8", "replace") for line in segment]
        covers = frozenset(i for i, line in enumerate(seg) if matches(line))
        for check in (
            self._claims(covers, claims, len(seg)),
            self._none_match("no_error_lines", matches, [e.encode("utf-8", "replace") for e in errors]
                             + [s for s in seg if self.guard.is_error_like(s)], "error-like line"),
            self._none_match("no_corpus_lines", matches, self._corpus, "corpus error line"),
            self._not_over_general(matches, tree),
            self._none_match("no_evidence_lines", matches,
                             self._evidence + [e.encode("utf-8", "replace") for e in evidence],
                             "classifier evidence line"),
            self._keeps_progress(program, [segment[i] for i in sorted(covers)],
                                 [line for i, line in enumerate(segment) if i not in covers]),
        ):
            checks.append(check)
            if not check.ok:
                break
        return Validation(pattern, tuple(checks), covers)

    # -- the checks --------------------------------------------------------------------------
    def _compile(self, pattern: str):
        if not pattern or not pattern.strip():
            return None, None, "empty pattern"
        if len(pattern) > MAX_PATTERN_CHARS:
            return None, None, f"{len(pattern)} characters, more than {MAX_PATTERN_CHARS}"
        import regex  # here, not at the top: a diagnose that learns nothing never loads it

        try:
            regex.compile(pattern)
            tree = sre_parse.parse(pattern)
        except (regex.error, re.error, RecursionError, OverflowError) as exc:
            return None, None, f"does not compile: {str(exc)[:120]}"
        try:
            program = FilterProgram([FilterRule("candidate", pattern, trusted=False)], self.guard)
        except (FilterCompileError, ValueError) as exc:
            return None, None, f"the filter engine refuses it: {str(exc).rsplit(': ', 1)[-1][:120]}"
        return program, tree, ""

    @staticmethod
    def _line_bounded(tree) -> Check:
        found = _newline_node(tree, bool(tree.state.flags & sre_c.SRE_FLAG_DOTALL))
        return Check("line_bounded", found is None, f"{found} could join two lines" if found else "")

    def _bounded_time(self, pattern: str, tree, segment: Sequence[str], claims: Iterable[int]) -> Check:
        if _nested_quantifier(tree):
            return Check("bounded_time", False, "nested unbounded quantifier (catastrophic backtracking)")
        body = non_capturing(pattern, keep_named=True)
        import regex  # see _compile

        compiled = regex.compile("^%s(?:%s)$" % (ENVELOPE_PATTERN, body))
        spent = 0.0
        for text in self._adversarial(tree, segment, claims):
            start = time.perf_counter()
            try:
                compiled.match(text, timeout=self.timeout_s)
            except TimeoutError:
                return Check("bounded_time", False, f"no answer within {self.timeout_s * 1000:.0f} ms "
                                                    f"on a {len(text)}-character input")
            spent += time.perf_counter() - start
            if spent > TIME_BUDGET_S:
                return Check("bounded_time", False, f"{spent * 1000:.0f} ms over the adversarial inputs")
        return Check("bounded_time", True, f"{spent * 1000:.1f} ms")

    @staticmethod
    def _adversarial(tree, segment: Sequence[str], claims: Iterable[int]) -> list[str]:
        chars: set[str] = {"a", "0", " ", ".", "-", "/", ":", "=", ","}
        _chars_of(tree, chars)
        n = ADVERSARIAL_REPEAT
        inputs = [c * n + "\x01" for c in sorted(chars) if c not in "\n\r"]
        inputs += ["a " * (n // 2) + "\x01", "0." * (n // 2) + "\x01", "a=1 " * (n // 4) + "\x01"]
        picked = [segment[i] for i in list(claims)[:3] if 0 <= i < len(segment)] or list(segment[:3])
        for line in picked:
            inputs += [line + "\x01", line[:-1] + "\x01" if line else "\x01", (line + " ") * 8 + "\x01"]
        return inputs

    def _claims(self, covers: frozenset[int], claims: Iterable[int], size: int) -> Check:
        claimed = set(claims)
        outside = sorted(i for i in claimed if not 0 <= i < size)
        if outside:
            return Check("claims", False, f"claims {len(outside)} line(s) that are not in the segment")
        missed = sorted(claimed - covers)
        if missed:
            return Check("claims", False, f"does not match {len(missed)} of the {len(claimed)} lines it claims")
        if len(covers) < self.min_support:
            return Check("claims", False, f"matches {len(covers)} line(s) of the segment, fewer than {self.min_support}")
        return Check("claims", True, f"matches {len(covers)} line(s)")

    @staticmethod
    def _none_match(name: str, matches, lines: Sequence[bytes], what: str) -> Check:
        for line in lines:
            if matches(line):
                return Check(name, False, f"matches a {what}")
        return Check(name, True)

    @staticmethod
    def _keeps_progress(program: FilterProgram, covered: Sequence[str], uncovered: Sequence[str] = ()) -> Check:
        extractor = program.extractors[0]
        if extractor is not None and "loss" in extractor.fields:
            for line in uncovered:
                found = loss_fields(line)
                if found is not None and found[0] is not None:
                    return Check("keeps_progress", False, f"reads the loss of only some of the lines that report "
                                                          f"one at a step; not e.g. {line[:80]!r}")
            return Check("keeps_progress", True)
        for line in covered:
            if loss_fields(line) is not None:
                return Check("keeps_progress", False, f"drops lines that report a loss without reading it "
                                                      f"(a `loss` named group), e.g. {line[:80]!r}")
        return Check("keeps_progress", True)

    def _not_over_general(self, matches, tree) -> Check:
        name = "not_over_general"
        for probe in OVER_GENERAL_PROBES:
            if matches(probe.encode()):
                return Check(name, False, f"matches the unrelated probe {probe[:40]!r}")
        literal = _literal_chars(tree)
        if literal < MIN_LITERAL_CHARS:
            return Check(name, False, f"only {literal} literal character(s)")
        if self._held_out:
            hits = sum(1 for line in self._held_out if matches(line))
            share = hits / len(self._held_out)
            if share > self.max_held_out_share:
                return Check(name, False, f"filters {share:.0%} of a held-out healthy sample of other formats")
        return Check(name, True)


# -- diagnosis rules ---------------------------------------------------------------------------
def validate_diagnosis_rule(rule, *, examples: Sequence[str], counter_examples: Sequence[str] = (),
                            held_out: Sequence[str] = HELD_OUT_HEALTHY) -> Validation:
    """Checks of a diagnosis rule (a `rules.model.DiagnosisRule`) edited or imported by a person.

    A diagnosis rule names the reason of a failure, so a bad one mislabels jobs rather than
    hiding lines. Checks, stopping at the first failure: `syntax` (each pattern compiles under
    Python `re` and in RE2, the classifier's only engine: a backtracking feature is refused
    by name), `bounded_time` (always true once RE2 runs it: linear time), `claims` (at least one example,
    each matched by the rule, counter-examples matched by none), `not_over_general` (some
    literal text in every pattern; no unrelated probe and no routine line of the held-out
    healthy sample matches).
    """
    from rules.classifier import DiagnosisCompileError, DiagnosisProgram
    from rules.envelope import split_envelope

    joined = " | ".join(rule.patterns)
    checks: list[Check] = []

    def done(check: Check) -> Validation | None:
        checks.append(check)
        return None if check.ok else Validation(joined, tuple(checks))

    trees = []
    problem = ""
    if not rule.patterns:
        problem = "no pattern"
    for pattern in rule.patterns:
        if problem:
            break
        if not pattern.strip():
            problem = "empty pattern"
        elif len(pattern) > MAX_PATTERN_CHARS:
            problem = f"{len(pattern)} characters, more than {MAX_PATTERN_CHARS}"
        else:
            import regex  # see _compile

            try:
                regex.compile(pattern)
                trees.append(sre_parse.parse(pattern))
            except (regex.error, re.error, RecursionError, OverflowError) as exc:
                problem = f"{pattern[:60]!r} does not compile: {str(exc)[:120]}"
    program = None
    if not problem:
        try:
            program = DiagnosisProgram([rule])
        except DiagnosisCompileError as exc:
            problem = f"the classifier refuses it: {exc.reason[:200]}"
    failed = done(Check("syntax", not problem, problem))
    if failed:
        return failed

    # Every diagnosis rule runs in RE2 only (its set and its group reader), so its cost is
    # linear in a line's length whatever the pattern says; a pattern RE2 cannot run has
    # already failed `syntax` with the backtracking feature named.
    done(Check("bounded_time", True, "RE2: linear in the line's length"))

    def matches(line: str) -> bool:
        return program.match(split_envelope(line).message) is not None

    if not examples:
        claim = Check("claims", False, "no example line: give at least one error line the rule must match")
    else:
        missed = [e for e in examples if not matches(e)]
        wrong = [c for c in counter_examples if matches(c)]
        if missed:
            claim = Check("claims", False, f"does not match {len(missed)} of its {len(examples)} example(s), "
                                           f"e.g. {missed[0][:120]!r}")
        elif wrong:
            claim = Check("claims", False, f"matches its counter-example {wrong[0][:120]!r}")
        else:
            claim = Check("claims", True, f"matches its {len(examples)} example(s)")
    failed = done(claim)
    if failed:
        return failed

    general = ""
    for pattern, tree in zip(rule.patterns, trees, strict=True):
        if _literal_chars(tree) < MIN_LITERAL_CHARS:
            general = f"{pattern[:60]!r} has only {_literal_chars(tree)} literal character(s)"
            break
    if not general:
        hit = next((p for p in OVER_GENERAL_PROBES if matches(p)), None)
        if hit is not None:
            general = f"matches the unrelated probe {hit[:40]!r}"
    if not general:
        hit = next((line for line in held_out if matches(line)), None)
        if hit is not None:
            general = f"matches a routine line of the held-out healthy sample: {hit[:80]!r}"
    done(Check("not_over_general", not general, general))
    return Validation(joined, tuple(checks))
