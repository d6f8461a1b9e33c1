"""The built-in diagnosis packs (rules/packs/diagnosis/*.yaml) against their own examples.

Every example is a real line (most with the public source they were taken from): the whole
program, all packs compiled together, must credit it to the rule that lists it. A counter
example must not be matched by its rule at all.
"""

from __future__ import annotations

import re

import pytest
import re2

from rules.classifier import MAX_QUOTE, Classifier, DiagnosisProgram, holes, render_mitigation
from rules.envelope import split_envelope
from rules.model import KeptLine, Tier
from rules.builtin import builtin_diagnosis_rules
from rules.rootcause import choose_root_cause
from rules.taxonomy import REASONS

RULES = builtin_diagnosis_rules()
PROGRAM = DiagnosisProgram(RULES)
EXAMPLES = [(rule.id, line) for rule in RULES for line in rule.examples]
COUNTER = [(rule, line) for rule in RULES for line in rule.counter_examples]
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def test_rule_ids_are_unique() -> None:
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids))


def test_every_reason_that_a_line_can_name_has_a_rule() -> None:
    # A hang prints nothing: it is found from progress, never from a line.
    assert set(REASONS) - {rule.reason for rule in RULES} == {"hang"}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_patterns_compile_in_both_engines_and_rules_document_themselves(rule) -> None:
    for pattern in rule.patterns:
        re.compile(pattern)
        re2.compile(pattern)
    assert rule.description
    if rule.tier is not Tier.CONTEXT:
        assert rule.examples, "every rule that can name a root cause shows a real line it matches"


@pytest.mark.parametrize("rule", [r for r in RULES if r.mitigation], ids=lambda r: r.id)
def test_mitigation_placeholders_are_filled_by_something(rule) -> None:
    groups = {f"g_{name}" for pattern in rule.patterns for name in re.compile(pattern).groupindex}
    for name in PLACEHOLDER.findall(rule.mitigation):
        assert name in {"node", "rank", "file", "match"} | groups, name


def test_a_mitigation_quotes_the_error_as_the_line_says_it() -> None:
    """`{match}` runs from where the pattern matched to the end of the line: a pattern that
    stops at the exception's type still quotes its message."""
    rule, groups = PROGRAM.match("[rank1]: ValueError: micro batch size 3 does not divide global batch size 128")
    assert groups["match"] == "ValueError: micro batch size 3 does not divide global batch size 128"
    assert "(ValueError: micro batch size 3 does not divide global batch size 128)" in render_mitigation(rule.mitigation, groups)
    assert len(PROGRAM.match("ValueError: " + "x" * 5000)[1]["match"]) <= MAX_QUOTE


@pytest.mark.parametrize(("text", "found"), [
    ("Drain {node} and restart.", ["{node}"]),
    ("A CUDA kernel failed on rank the rank that reported it.", ["rank the rank that reported it"]),
    ("Cordon None on the next restart.", ["Cordon None"]),
    ("Restart from the last checkpoint; cordon h100-025 if it repeats.", []),
    ("None of the ranks printed an error: restart.", []),
])
def test_holes_in_a_mitigation_are_found(text: str, found: list[str]) -> None:
    assert holes(text) == found


@pytest.mark.parametrize(("rule_id", "line"), EXAMPLES, ids=[f"{r}:{i}" for i, (r, _) in enumerate(EXAMPLES)])
def test_example_is_credited_to_its_own_rule(rule_id: str, line: str) -> None:
    hit = PROGRAM.match(split_envelope(line).message)
    assert hit is not None, f"no rule matches {line!r}"
    assert hit[0].id == rule_id


@pytest.mark.parametrize(("rule", "line"), COUNTER, ids=[f"{r.id}:{i}" for i, (r, _) in enumerate(COUNTER)])
def test_counter_example_is_not_matched_by_its_rule(rule, line: str) -> None:
    message = split_envelope(line).message
    assert not any(re.search(p, message) for p in rule.patterns)


def test_routine_lines_name_no_failure() -> None:
    routine = [
        " iteration     1200/  500000 | consumed samples:      2457600 | elapsed time per iteration (ms): 6143.2 | learning rate: 2.999E-04 | lm loss: 2.318641E+00 | loss scale: 1.0 | grad norm: 0.291 |",
        "gpu-012:1234:5678 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC",
        "> building indices for MMapIndexedDataset ...",
        "  reading sizes...",
        "    raise KeyError(key)",
        "  File \"/workspace/Megatron-LM/megatron/training/training.py\", line 1220, in train_step",
        "[2024-07-17 19:44:06,829] [INFO] [loss_scaler.py:190:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
        "Traceback (most recent call last):",
    ]
    assert [line for line in routine if PROGRAM.match(split_envelope(line).message)] == []


def _root(lines: list[str]):
    classifier = Classifier(PROGRAM, default_year=2025)
    for number, text in enumerate(lines, 1):
        classifier.feed(KeptLine(number, text, True, "job.log"))
    return choose_root_cause(classifier.found)


def test_a_runtime_error_that_reports_a_timeout_is_a_timeout_not_a_runtime_error() -> None:
    root, _ = _root([
        "[rank3]: RuntimeError: NCCL communicator was aborted on rank 3.  Original reason for failure was: "
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2189, OpType=ALLREDUCE, "
        "Timeout(ms)=1800000) ran for 1800410 milliseconds before timing out.",
    ])
    assert root.rule.reason == "nccl_timeout"


def test_ib_failure_on_one_node_explains_the_avalanche() -> None:
    lines = [
        "[default5]:[rank13]:[E314 10:02:11.120338117 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 13] Timeout at NCCL work: 88121, last enqueued NCCL work: 88121, last completed NCCL work: 88120.",
        "hgx-041:81231:81977 [5] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.7.3.12<44206> with status=12 opcode=129 len=65536 vendor err 129 (Recv) localGid ::ffff:10.7.3.11 remoteGids::ffff:10.7.3.12",
        "[default5]:[rank13]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5",
        "[default5]:[rank13]: RuntimeError: [Rank 13] Process group watchdog thread terminated with exception",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "srun: error: hgx-041: tasks 8-15: Exited with exit code 1",
    ]
    root, others = _root(lines)
    assert root.rule.reason == "network_error"
    assert root.evidence.line_number == 2
    assert {"nccl_timeout", "nccl_remote_error"} <= {o.reason for o in others}


def test_a_script_error_on_rank_zero_beats_the_timeouts_it_causes() -> None:
    lines = [
        "[rank0]: Traceback (most recent call last):",
        "[rank0]:   File \"/workspace/train.py\", line 211, in <module>",
        "[rank0]:     cfg = config[\"model\"][\"rope_scaling\"]",
        "[rank0]: KeyError: 'rope_scaling'",
        *[f"[rank{r}]:[E1206 18:44:16.994932383 ProcessGroupNCCL.cpp:1709] [PG 1 Rank {r}] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752." for r in range(1, 8)],
    ]
    root, _ = _root(lines)
    assert (root.rule.reason, root.evidence.line_number, root.evidence.groups["key"]) == ("key_error", 4, "'rope_scaling'")


def test_every_diagnosis_example_reaches_the_classifier() -> None:
    """Only error-like lines go to the classifier (rules.job): a rule whose lines the guard
    misses (Kubernetes' 'The node was low on resource: memory.') never fires on a real log."""
    from rules.rulebook import Rulebook

    book = Rulebook()
    missed = [(rule.id, line) for rule in book.diagnosis_rules for example in rule.examples
              for line in [example if isinstance(example, str) else example.line]
              if not book.guard.is_error_like(line)]
    assert missed == []
