"""The Log Agent end to end with the embedded miner, on the two generated unknown formats."""

from __future__ import annotations

import pytest

from agents.log_agent import LogAgent, LogAgentConfig, MemorySink, learned_scope, rule_id
from fixtures.logs.unknown_formats import GeneratedLog, helix_log, maxtext_log
from rules.model import RuleStatus
from rules.job import JobMeta, JobRun
from rules.rulebook import Rulebook


@pytest.fixture(scope="module")
def rulebook() -> Rulebook:
    return Rulebook()


def feed(run: JobRun, log: GeneratedLog, start: int, stop: int, source: str = "job.log", chunk: int = 400) -> set[int]:
    kept: set[int] = set()
    for i in range(start, stop, chunk):
        block = log.lines[i:min(i + chunk, stop)]
        kept |= {k.line_number for k in run.feed(source, ("\n".join(block) + "\n").encode())}
    return kept


def freeze(run: JobRun) -> None:
    """The agent has seen what was fed so far (its open segment too) and learns no more."""
    run.add_filter_rules(run.log_agent.finish(run.view()))
    run.log_agent = None


def figures(log: GeneratedLog, kept: set[int], after: int) -> tuple[float, int, int]:
    routine = [i for i in range(after, len(log.lines)) if log.kinds[i] == "routine"]
    filtered = sum(1 for i in routine if i + 1 not in kept) / len(routine)
    errors = [i for i, kind in enumerate(log.kinds) if kind == "error"]
    return filtered, sum(1 for i in errors if i + 1 in kept), len(errors)


@pytest.mark.parametrize("log", [
    pytest.param(maxtext_log(steps=700, workers=4, seed=11, failure="oom"), id="maxtext-oom"),
    pytest.param(maxtext_log(steps=700, workers=4, seed=12, failure="barrier"), id="maxtext-barrier"),
    pytest.param(helix_log(steps=6000, nodes=2, ranks_per_node=8, seed=11, failure="ecc"), id="helix-ecc"),
    pytest.param(helix_log(steps=6000, nodes=2, ranks_per_node=8, seed=12, failure="keyerror"), id="helix-keyerror"),
])
def test_unknown_format_is_compressed_after_its_first_part_without_losing_an_error(rulebook, log) -> None:
    agent = LogAgent(LogAgentConfig(), corpus=[])
    meta = JobMeta(name=log.name)
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    cut = len(log.lines) // 20
    kept = feed(run, log, 0, cut)
    freeze(run)  # what was learned from the first 5% only
    kept |= feed(run, log, cut, len(log.lines))
    filtered, errors_kept, errors = figures(log, kept, cut)
    assert errors_kept == errors
    assert filtered >= 0.95, filtered
    templates = {t for t in log.templates if t}
    assert 0 < len(run.learned) <= len(templates) + 2
    assert all(r.source == "log_agent:embedded" and not r.trusted for r in run.learned)
    assert all(r.scope == f"family:{meta.family}" for r in run.learned)


def test_learned_metric_rules_keep_progress(rulebook) -> None:
    log = maxtext_log(steps=400, workers=2, seed=5, failure=None)
    agent = LogAgent(LogAgentConfig(), corpus=[])
    meta = JobMeta(name=log.name)
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    feed(run, log, 0, len(log.lines))
    progress = run.finish().progress
    assert progress["last_step"] == 399
    assert 1.0 < progress["last_loss"] < 12.0


def test_resubmitted_job_starts_with_its_family_rules(rulebook) -> None:
    first = maxtext_log(steps=500, workers=4, seed=21, failure="oom")
    again = maxtext_log(steps=500, workers=4, seed=22, failure="oom")  # new run id, date and pods
    meta1, meta2 = JobMeta(name=first.name), JobMeta(name=again.name)
    assert meta1.name != meta2.name and meta1.family == meta2.family == "maxtext-llama2-7b"
    sink = MemorySink()
    agent = LogAgent(LogAgentConfig(), sink=sink, corpus=[])
    run = JobRun(rulebook, meta1, log_agent=agent.for_job(meta1))
    feed(run, first, 0, len(first.lines))
    run.finish()
    stored = [rule for rule, status, _ in sink.rules.values() if status == RuleStatus.ACTIVE]
    book = Rulebook(builtin_filters=[], builtin_diagnosis=[], source=_Source(stored))
    resubmitted = JobRun(book, meta2)  # no agent at all: only what the family learned
    assert {r.id for r in resubmitted.filter_program.rules} == {r.id for r in stored}
    kept = feed(resubmitted, again, 0, len(again.lines))
    filtered, errors_kept, errors = figures(again, kept, 0)
    assert errors_kept == errors
    assert filtered >= 0.95
    other = JobRun(book, JobMeta(name="helix-13b-pretrain-20250212-2265b1"))
    assert other.filter_program.rules == []  # another family does not get them


class _Source:
    def __init__(self, rules):
        self.rules = rules

    def active_rules(self):
        return list(self.rules), []

    def version(self) -> int:
        return 1


@pytest.mark.parametrize(("meta", "scope", "status"), [
    (JobMeta(name="llama-70b-pretrain-20241103-7f3a9c", framework="megatron"), "family:llama-70b-pretrain", "active"),
    (JobMeta(name="run-42", tags=("family:helix-13b",)), "family:helix-13b", "active"),
    (JobMeta(name="", framework="maxtext"), "framework:maxtext", "active"),
    (JobMeta(name="20241103"), "global", "pending"),
    (JobMeta(), "global", "pending"),
])
def test_scope_of_learned_rules(meta: JobMeta, scope: str, status: str) -> None:
    assert learned_scope(meta) == (scope, RuleStatus(status))


def test_anonymous_job_uses_its_rules_but_stores_them_pending(rulebook) -> None:
    log = helix_log(steps=9000, nodes=1, ranks_per_node=8, seed=3, failure=None)
    sink = MemorySink()
    agent = LogAgent(LogAgentConfig(), sink=sink, corpus=[])
    run = JobRun(rulebook, JobMeta(), log_agent=agent.for_job(JobMeta()))
    kept = feed(run, log, 0, len(log.lines))
    assert len(kept) < len(log.lines) / 2  # the rules took effect in the job itself
    assert sink.rules and {status for _, status, _ in sink.rules.values()} == {"pending"}
    assert {rule.scope for rule, _, _ in sink.rules.values()} == {"global"}


def test_a_rejected_rule_is_not_brought_back(rulebook) -> None:
    log = helix_log(steps=1500, nodes=1, ranks_per_node=8, seed=4, failure=None)
    sink = MemorySink()
    agent = LogAgent(LogAgentConfig(), sink=sink, corpus=[])
    meta = JobMeta(name=log.name)
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    feed(run, log, 0, len(log.lines))
    learned = {r.id: r for r in run.learned}
    victim = next(iter(learned.values()))
    assert victim.id == rule_id(victim.scope, victim.pattern)
    rejected = MemorySink()
    rejected.rules[victim.id] = (victim, "rejected", {})
    again = JobRun(rulebook, meta, log_agent=LogAgent(LogAgentConfig(), sink=rejected, corpus=[]).for_job(meta))
    feed(again, log, 0, len(log.lines))
    assert victim.id not in {r.id for r in again.learned}


def test_provenance_records_votes_evidence_and_validation(rulebook) -> None:
    log = maxtext_log(steps=300, workers=4, seed=7, failure=None)
    sink = MemorySink()
    agent = LogAgent(LogAgentConfig(votes=5), sink=sink, corpus=[])
    meta = JobMeta(name=log.name, framework="maxtext", tags=("tpu",))
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    feed(run, log, 0, len(log.lines))
    rule, status, provenance = next(iter(sink.rules.values()))
    assert status == "active"
    assert provenance["backend"] == "embedded" and provenance["model"] == "drain3"
    assert 3 <= provenance["votes"] <= 5 and provenance["k"] == 5 and provenance["quorum"] == 3
    assert provenance["evidence"] and all(isinstance(line, str) for line in provenance["evidence"])
    assert set(provenance["validation"]) >= {"syntax", "bounded_time", "no_error_lines", "not_over_general"}
    assert set(provenance["validation"].values()) == {"ok"}
    assert provenance["job"] == {"name": log.name, "framework": "maxtext", "tags": ["tpu"]}


def test_alert_lines_go_to_the_classifier_and_are_never_learned(rulebook) -> None:
    lines = [f"[helix 10:00:{i % 60:02d}.000 trn-a1/r00] step {i} | loss 2.{i:03d}" for i in range(40)]
    lines.insert(20, "[helix 10:00:20.500 trn-a1/r00] WARN straggler rank=3 step_time=2.9s (median 0.4s)")
    agent = LogAgent(LogAgentConfig(segment_lines=16), corpus=[])
    meta = JobMeta(name="helix-test-run-1")
    run = JobRun(rulebook, meta, log_agent=agent.for_job(meta))
    kept = run.feed("a.log", ("\n".join(lines) + "\n").encode())
    flagged = [k for k in kept if k.error_like]
    assert [k.line_number for k in flagged] == [21]
    assert run.learned and not any(k.line_number == 21 for k in kept if not k.error_like)


def test_config_is_validated() -> None:
    for bad in ({"votes": 0}, {"votes": 16}, {"min_support": 0}, {"segment_lines": 0}, {"agreement": 0.0}):
        with pytest.raises(ValueError):
            LogAgentConfig(**bad)


def test_once_learned_the_slices_grow_back_to_whole_buffers(rulebook, monkeypatch) -> None:
    """A buffer is fed in 64 KB slices only while the agent learns; a slice that keeps
    nothing learned nothing, so the slices grow again (they stayed at 64 KB for the rest of
    a log after the first slice that learned: a first run at half its speed)."""
    log = helix_log(steps=220000, nodes=2, ranks_per_node=8, seed=13, failure="ecc")
    data = ("\n".join(log.lines) + "\n").encode()
    meta = JobMeta(name=log.name)
    run = JobRun(rulebook, meta, log_agent=LogAgent(LogAgentConfig(), corpus=[]).for_job(meta))
    sizes: list[int] = []
    real = JobRun._feed

    def spy(self, source, buffer, **kw):
        sizes.append(len(buffer))
        return real(self, source, buffer, **kw)

    monkeypatch.setattr(JobRun, "_feed", spy)
    for start in range(0, len(data), 8 << 20):
        stop = data.rfind(b"\n", 0, min(len(data), start + (8 << 20))) + 1
        run.feed("job.log", data[start:stop])
    assert run.learned
    assert len(data) > 4 << 20 and len(sizes) < 40, (len(data), len(sizes))
