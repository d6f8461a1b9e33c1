"""Classifier and root-cause choice, on small rule sets written here (the packs have their own tests)."""

from __future__ import annotations

from rules.classifier import Classifier, DiagnosisProgram, render_mitigation
from rules.model import DiagnosisRule, KeptLine, Tier
from rules.rootcause import choose_root_cause
from rules.taxonomy import Action, Origin


def rule(rule_id: str, reason: str, tier: Tier, *patterns: str, origin: Origin = Origin.INFRASTRUCTURE,
         source: str = "builtin", mitigation: str = "") -> DiagnosisRule:
    return DiagnosisRule(rule_id, reason, tier, patterns, origin, Action.RESTART, mitigation=mitigation, source=source)


RULES = [
    rule("ecc", "ecc_error", Tier.HARDWARE, r"uncorrectable ECC error encountered"),
    rule("ib", "network_error", Tier.NETWORK, r"NET/IB : Got completion from peer \S+ with status=12"),
    rule("cuda", "cuda_error", Tier.DEVICE, r"CUDA error: (?:an illegal memory access|unknown error)"),
    rule("keyerror", "key_error", Tier.CAUSE, r"(?:^|[\s:])KeyError: (?P<key>.+)", origin=Origin.USER),
    rule("valueerror", "value_error", Tier.CAUSE, r"(?:^|[\s:])ValueError: ", origin=Origin.USER),
    rule("runtime", "runtime_error", Tier.GENERIC, r"(?:^|[\s:])RuntimeError: ", origin=Origin.USER),
    rule("timeout", "nccl_timeout", Tier.SYMPTOM, r"Watchdog caught collective operation timeout"),
    rule("remote", "nccl_remote_error", Tier.SYMPTOM, r"ncclRemoteError"),
    rule("child", "runtime_error", Tier.SYMPTOM, r"ChildFailedError"),
    rule("frame", "runtime_error", Tier.CONTEXT, r"^frame #\d+: "),
]
PROGRAM = DiagnosisProgram(RULES)


def classify(*sources: tuple[str, list[str]]):
    classifier = Classifier(PROGRAM, default_year=2024)
    for name, lines in sources:
        for number, text in enumerate(lines, 1):
            classifier.feed(KeptLine(number, text, True, name))
    return choose_root_cause(classifier.found)


def test_hardware_error_on_one_rank_beats_timeouts_everywhere_before_and_after() -> None:
    lines = [
        "[default1]:[rank1]:[E817 17:30:01.000000001 ProcessGroupNCCL.cpp:1515] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)",
        "[default0]:[rank12]:[E817 17:40:34.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 12] Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered",
        *[f"[default{r}]:[rank{r}]:[E817 17:50:34.1 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout" for r in range(8)],
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ]
    root, others = classify(("job.log", lines))
    assert root.rule.id == "ecc"
    assert root.evidence.rank == 12 and root.evidence.line_number == 2
    assert root.confidence >= 0.9
    assert {o.reason for o in others} == {"nccl_timeout", "runtime_error"}
    assert next(o for o in others if o.reason == "nccl_timeout").count == 9


def test_specific_rule_wins_over_generic_on_the_same_line() -> None:
    root, _ = classify(("x", ["[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered"]))
    assert root.rule.id == "cuda"


def test_exception_chain_prefers_the_exception_it_came_from() -> None:
    lines = [
        "Traceback (most recent call last):",
        "ValueError: bad shape",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        "KeyError: 'model.layers.0'",
    ]
    root, others = classify(("x", lines))
    assert root.rule.id == "valueerror"
    assert [o.reason for o in others] == ["key_error"]


def test_chains_are_tracked_per_rank() -> None:
    lines = [
        "[rank0]: ValueError: bad shape",
        "[rank1]: KeyError: 'lr'",
        "[rank0]: During handling of the above exception, another exception occurred:",
        "[rank0]: KeyError: 'other'",
    ]
    root, _ = classify(("x", lines))
    # rank 1's KeyError is not a consequence of rank 0's ValueError; both are causes: earliest wins
    assert root.rule.id == "valueerror"


def test_symptoms_alone_give_a_low_confidence_root_cause() -> None:
    root, _ = classify(("x", ["[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)",
                              "torch.distributed.DistBackendError: ncclRemoteError: remote process exited"]))
    assert root.rule.id == "timeout"
    assert root.confidence < 0.6


def test_context_lines_never_become_the_root_cause() -> None:
    root, others = classify(("x", ["frame #0: c10::Error::Error(...)", "frame #1: foo"]))
    assert root is None and others == []


def test_across_files_the_earliest_time_stamp_wins_not_the_file_order() -> None:
    node0 = ["[rank0]:[E817 17:45:00.000 ProcessGroupNCCL.cpp:1] [rank0]: RuntimeError: CUDA error: unknown error"]
    node1 = ["[rank9]:[E817 17:40:00.000 ProcessGroupNCCL.cpp:1] [rank9]: RuntimeError: CUDA error: an illegal memory access"]
    root, _ = classify(("node-0.log", node0), ("node-1.log", node1))
    assert root.evidence.source == "node-1.log"
    assert root.evidence.rank == 9


def test_two_causes_of_one_tier_lower_the_confidence() -> None:
    root, _ = classify(("x", ["KeyError: 'a'", "ValueError: b"]))
    assert root.rule.id == "keyerror"
    assert root.confidence < 0.9


def test_named_groups_reach_the_mitigation_without_format_tricks() -> None:
    classifier = Classifier(PROGRAM)
    item = classifier.feed(KeptLine(1, "KeyError: 'lr'", True, "x"))
    assert item.groups["key"] == "'lr'"
    text = render_mitigation("Add {g_key} to the config on {node}; {g_key.__class__} {0}", {"g_key": "'lr'"})
    assert text == "Add 'lr' to the config on the node that reported it; {g_key.__class__} {0}"


def test_untrusted_rules_are_read_with_a_time_bound() -> None:
    program = DiagnosisProgram([rule("evil", "runtime_error", Tier.GENERIC, r"(a+)+$", source="failure_agent")])
    classifier = Classifier(program)
    item = classifier.feed(KeptLine(1, "a" * 40 + "!", True, "x"))
    assert item is None  # RE2 (linear) says no match; the regex reader is never reached
    item = classifier.feed(KeptLine(2, "aaaa", True, "x"))
    assert item is not None and item.rule_id == "evil"


def test_a_traceback_source_line_is_not_an_error_report() -> None:
    # `    raise DatasetNotFoundError(f"...")` under a frame is code that names an exception,
    # not the exception; the exception line at the end of the traceback is.
    lines = [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/workspace/train.py", line 88, in load',
        '[rank0]:     logger.error("ValueError: %s", err)',
        '[rank1]:   File "/workspace/train.py", line 12, in <module>',
        "[rank0]: KeyError: 'lr'",
        "[rank1]:     main()",
    ]
    root, others = classify(("x", lines))
    assert root.rule.id == "keyerror"
    assert others == []


def test_an_indented_exception_line_after_the_traceback_still_counts() -> None:
    lines = [
        '  File "/workspace/train.py", line 88, in load',
        "    model.load_state_dict(sd)",
        "KeyError: 'lr'",
        "    ValueError: raised later, printed indented by a wrapper",
    ]
    root, others = classify(("x", lines))
    assert root.rule.id == "keyerror"
    assert [o.reason for o in others] == ["value_error"]


def test_an_agent_answer_replaces_a_signals_evidence_only_with_a_stronger_tier() -> None:
    from rules.verdict import RootCauseView, agent_may_replace

    killed = RootCauseView("out_of_memory", "framework", "user", "] exits with return code = -9", 7, "a.log",
                           None, None, 0.5, "evidence:sigkill")
    launcher = "[ERROR] [launch.py:320:sigkill_handler] ['/opt/conda/bin/python', '-u', 'train.py',"
    # a guess from the nearest incidents on the launcher's own report of that exit: no
    assert not agent_may_replace(killed, None, launcher, "import_error", Tier.CAUSE)
    # nor a relabelling of the exit line itself: its neighbours are the launcher's other
    # exits (`return code = 1`: called_process_error), the -9 is what the evidence read
    assert not agent_may_replace(killed, None, killed.line, "called_process_error", Tier.CAUSE)
    # while a rule's own line is the agent's to relabel
    generic = RootCauseView("runtime_error", "framework", "user", "RuntimeError: boom", 3, "a.log", None, None, 0.5,
                            "rule:python.runtime-error")
    assert agent_may_replace(generic, Tier.GENERIC, generic.line, "cuda_error", Tier.CAUSE)
    # a hardware fault the rules did not know: yes
    assert agent_may_replace(killed, None, "GPU 3 has fallen off the bus", "cuda_error", Tier.HARDWARE)
    # nor a line that says nothing of an error (a wrapped line's tail), over a rule's symptom
    timeout = RootCauseView("nccl_timeout", "infrastructure", "infrastructure", "Some NCCL operations have failed",
                            1, "a.log", None, None, 0.7, "rule:nccl.watchdog-timeout")
    tail = "tions might run on corrupted/incomplete data."
    assert not agent_may_replace(timeout, Tier.SYMPTOM, tail, "out_of_memory", Tier.CAUSE, error_like=False)
    assert agent_may_replace(timeout, Tier.SYMPTOM, "CUDA out of memory.", "out_of_memory", Tier.CAUSE)
    # a root cause no rule and no evidence named is open to the agent
    unmatched = RootCauseView("unknown", None, "unknown", launcher, 4, "a.log", None, None, 0.0, "unmatched")
    assert agent_may_replace(unmatched, None, launcher, "import_error", Tier.CAUSE)
