"""The built-in filter packs (rules/packs/filters/*.yaml) against their own examples.

Each rule carries real log lines it must drop (`examples`) and, where a look-alike error
exists, lines it must keep (`counter_examples`). The checks run with both engines the
service uses: RE2 (the filter's DFA, Latin-1 over bytes) and Python `re` (field extraction).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import re2
import yaml

from rules.envelope import split_envelope
from rules.extract import FieldExtractor
from rules.filters import FilterProgram
from rules.guard import ErrorGuard
from rules.model import FilterRule

FILTERS_DIR = Path(__file__).resolve().parents[2] / "rules" / "packs" / "filters"

# The progress fields rules/packs/README.md allows as named groups.
ALLOWED_FIELDS = {
    "step", "loss", "grad_norm", "step_time_ms", "step_time_s", "loss_scale", "lr",
    "skipped_iters", "nan_iters", "checkpoint_step",
}
ALLOWED_EVENTS = {"completed"}
RULE_KEYS = {"id", "description", "pattern", "examples", "counter_examples", "event"}
NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")

# Words that mark an error report: no filter rule may be shown dropping a line with one.
FORBIDDEN_IN_EXAMPLES = re.compile(
    r"Traceback|[A-Za-z]*(?:Error|Exception)\b|error:|FAILED|NCCL WARN|\bXid\b|Killed"
    r"|CANCELLED|terminate called|SIGTERM|closing signal|exitcode"
)


def _load_packs() -> dict[str, dict]:
    packs = {}
    for path in sorted(FILTERS_DIR.glob("*.yaml")):
        packs[path.stem] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return packs


PACKS = _load_packs()
RULES = [(stem, rule) for stem, pack in PACKS.items() for rule in pack["rules"]]
RULE_IDS = [rule["id"] for _, rule in RULES]
METRIC_RULES = [(stem, rule) for stem, rule in RULES if NAMED_GROUP.search(rule["pattern"])]


def _re2_latin1(pattern: str):
    opts = re2.Options()
    opts.encoding = re2.Options.Encoding.LATIN1
    return re2.compile(pattern.encode("latin-1"), opts)


def _message(line: str) -> str:
    return split_envelope(line).message


@pytest.fixture(scope="module")
def program() -> FilterProgram:
    """All built-in filter rules compiled the way the service compiles them."""
    rules = [FilterRule(id=r["id"], pattern=r["pattern"], event=r.get("event"),
                        scope=PACKS[stem]["scope"]) for stem, r in RULES]
    return FilterProgram(rules)


def test_every_pack_has_rules():
    assert "global" in PACKS
    assert len(PACKS) >= 8
    for stem, pack in PACKS.items():
        assert isinstance(pack, dict) and isinstance(pack.get("rules"), list) and pack["rules"], stem


@pytest.mark.parametrize("stem", sorted(PACKS))
def test_pack_scope(stem):
    scope = PACKS[stem]["scope"]
    # launchers and libraries every framework runs under apply to every job
    runtime = {"global", "nccl", "torch", "slurm"}
    assert scope == ("global" if stem in runtime else f"framework:{stem}")


def test_rule_ids_unique_across_packs():
    duplicates = {i for i in RULE_IDS if RULE_IDS.count(i) > 1}
    assert not duplicates


@pytest.mark.parametrize(("stem", "rule"), RULES, ids=RULE_IDS)
def test_rule_schema(stem, rule):
    assert set(rule) <= RULE_KEYS, set(rule) - RULE_KEYS
    assert re.fullmatch(r"[a-z_]+\.[a-z0-9-]+", rule["id"]), rule["id"]
    assert rule["id"].split(".")[0] == stem
    assert isinstance(rule["pattern"], str) and rule["pattern"]
    assert isinstance(rule.get("description"), str) and len(rule["description"]) > 20
    assert isinstance(rule["examples"], list) and rule["examples"]
    assert all(isinstance(e, str) for e in rule["examples"])
    assert all(isinstance(c, str) for c in rule.get("counter_examples") or [])
    if "event" in rule:
        assert rule["event"] in ALLOWED_EVENTS
    assert "\n" not in rule["pattern"]
    assert not rule["pattern"].startswith("^") and not rule["pattern"].endswith("$")


@pytest.mark.parametrize(("stem", "rule"), RULES, ids=RULE_IDS)
def test_named_groups_are_progress_fields(stem, rule):
    names = NAMED_GROUP.findall(rule["pattern"])
    assert set(names) <= ALLOWED_FIELDS, set(names) - ALLOWED_FIELDS
    assert len(names) == len(set(names)), "a field is captured twice"


@pytest.mark.parametrize(("stem", "rule"), RULES, ids=RULE_IDS)
def test_pattern_compiles_with_both_engines(stem, rule):
    re.compile(rule["pattern"])
    _re2_latin1(rule["pattern"])
    re2.compile(rule["pattern"])  # UTF-8 mode as well


@pytest.mark.parametrize(("stem", "rule"), RULES, ids=RULE_IDS)
def test_examples_fullmatch_own_pattern(stem, rule):
    py = re.compile(rule["pattern"])
    latin1 = _re2_latin1(rule["pattern"])
    utf8 = re2.compile(rule["pattern"])
    for line in rule["examples"]:
        message = _message(line)
        assert py.fullmatch(message), f"re: {line!r}"
        assert latin1.fullmatch(message.encode("utf-8")), f"re2 latin-1: {line!r}"
        assert utf8.fullmatch(message), f"re2 utf-8: {line!r}"


@pytest.mark.parametrize(("stem", "rule"), RULES, ids=RULE_IDS)
def test_examples_are_not_error_reports(stem, rule):
    guard = ErrorGuard()
    for line in rule["examples"]:
        assert not FORBIDDEN_IN_EXAMPLES.search(line), line
        assert not guard.error_line_spans(line.encode("utf-8") + b"\n"), f"error-like: {line!r}"


@pytest.mark.parametrize(("stem", "rule"), RULES, ids=RULE_IDS)
def test_engine_attributes_each_example_to_its_rule_only(stem, rule, program):
    """Rules must be disjoint: the engine gives a run of lines to the first rule that
    matches, so a metric line also matched by a chatter rule would lose its values."""
    own = RULE_IDS.index(rule["id"])
    for line in rule["examples"]:
        matching = program.rules_matching(line.encode("utf-8"))
        assert matching == [own], (line, [RULE_IDS[k] for k in matching])


def _all_counter_examples():
    return [(rule["id"], line) for _, rule in RULES for line in rule.get("counter_examples") or []]


@pytest.mark.parametrize(("rule_id", "line"), _all_counter_examples())
def test_counter_example_matches_no_rule(rule_id, line, program):
    message = _message(line)
    assert program.rules_matching(line.encode("utf-8")) == []
    for _, rule in RULES:
        assert not re.fullmatch(rule["pattern"], message), (rule["id"], line)
        assert not re.fullmatch(rule["pattern"], line), (rule["id"], line)


@pytest.mark.parametrize(("stem", "rule"), METRIC_RULES, ids=[r["id"] for _, r in METRIC_RULES])
def test_metric_examples_yield_numbers(stem, rule):
    py = re.compile(rule["pattern"])
    fields = NAMED_GROUP.findall(rule["pattern"])
    seen: set[str] = set()
    for line in rule["examples"]:
        groups = {k: v for k, v in py.fullmatch(_message(line)).groupdict().items() if v is not None}
        assert groups, f"no field read from {line!r}"
        for name, value in groups.items():
            float(value)
            seen.add(name)
    assert seen == set(fields), f"fields never exercised by an example: {set(fields) - seen}"


@pytest.mark.parametrize(("stem", "rule"), METRIC_RULES, ids=[r["id"] for _, r in METRIC_RULES])
def test_extractor_reads_every_example(stem, rule):
    """The service's own extraction path (findall over a run, else line by line)."""
    extractor = FieldExtractor(rule["pattern"], trusted=True)
    data = ("\n".join(rule["examples"]) + "\n").encode("utf-8")
    lines = list(range(1, len(rule["examples"]) + 1))
    numbers, columns = extractor.columns(data, 0, len(data), lines, 1)
    assert numbers == lines
    for column in columns:
        for raw in column:
            if raw:  # a field missing from a line reads as empty or None
                float(raw.decode("latin-1"))


def test_completion_events_are_marked():
    completed = {r["id"] for _, r in RULES if r.get("event") == "completed"}
    assert {"megatron.training-done", "hf_trainer.training-completed",
            "torchtitan.training-completed"} <= completed


@pytest.mark.parametrize("line", [
    # value groups accept the nan/inf spellings the frameworks print
    " [2025-03-31 05:54:07] iteration       51/  242204 | consumed samples:        50400 |"
    " elapsed time per iteration (ms): 1552.8 | learning rate: 8.000000E-06 | global batch size:  1008 |"
    " lm loss: NAN | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 |"
    " number of nan iterations:   1 |",
])
def test_megatron_iteration_reads_nan(line):
    rule = next(r for _, r in RULES if r["id"] == "megatron.iteration")
    match = re.fullmatch(rule["pattern"], line)
    assert match and match["loss"] == "NAN" and match["grad_norm"] == "nan" and match["nan_iters"] == "1"
