"""What the Failure Agent needs from the service: the knowledge base in the database, the
write-back into the rule store, and the agent built from the settings, lazily.

The agent is built only when a job needs it (`service.agents.failure_hook`), so a command
whose log the rules resolve neither loads the model nor imports this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agents.embeddings import Embedder, LazyEmbedder
from agents.failure_agent import Decision, FailureAgent, Retrieval
from agents.knowledge import KnowledgeBase, seed_incidents
from agents.llm import make_backend
from agents.mitigation import Facts, mitigation_for
from agents.validation import validate_diagnosis_rule
from agents.writeback import Conflict, has_literal_words, history_conflicts, pattern_from_line, synthesise_rule
from rules.model import DiagnosisRule, KeptLine, RuleKind, RuleStatus
from rules.verdict import Diagnosis, rule_id_of
from service.store import incidents
from service.store import jobs as store
from service.store.db import Database
from rules.job import JobMeta, JobRun, JobView
from rules.rulebook import Rulebook
from service.settings import Settings

ACTOR = "failure_agent"
JOBS_CHECKED = 100
INDEX_FOLDER = "vector_index"


def replay(rulebook: Rulebook, meta: JobMeta, kept: Sequence[KeptLine]) -> Diagnosis:
    """The rules' diagnosis of a job from its kept lines (no agent)."""
    run = JobRun(rulebook, meta)
    run.feed_kept(kept)
    return run.finish()


class _Rules:
    def __init__(self, diagnosis: list[DiagnosisRule]):
        self._diagnosis = diagnosis

    def active_rules(self):
        return [], self._diagnosis

    def version(self) -> int:
        return 0


class StoreWriteBack:
    """Suggested diagnosis rules: synthesised, validated against the labelled history,
    stored pending (or active with auto-accept), each step's outcome in the result."""

    def __init__(self, db: Database, rulebook: Rulebook, *, auto_accept: bool = False):
        self.db = db
        self.rulebook = rulebook
        self.auto_accept = auto_accept

    def suggest(self, job: JobView, decision: Decision, retrieval: Retrieval, mitigation: str) -> dict[str, Any]:
        line = decision.line.text
        if decision.chunk.rule is not None:
            return {"status": "skipped", "reason": f"rule {decision.chunk.rule.id} already matches the line"}
        if not has_literal_words(line):
            return self._refused(None, "the line has too few fixed words to make a rule of")
        p = pattern_from_line(line)
        # the rule's mitigation names the node and the path of the job it will match next
        facts = Facts(nodes=("{node}",), paths=("{g_path}",) if "(?P<path>" in p else ())
        template = mitigation_for(decision.reason, decision.origin, facts)
        candidate = synthesise_rule(line, reason_id=decision.reason, origin=decision.origin, tier=decision.tier,
                                    mitigation=template,
                                    description=f"Suggested by the Failure Agent ({decision.backend}) for a "
                                                f"{decision.reason} it diagnosed.")
        validation = validate_diagnosis_rule(candidate, examples=[line])
        if not validation.ok:
            failed = "; ".join(f"{c.name}: {c.detail}" for c in validation.checks if not c.ok)
            return self._refused(candidate, f"the rule is not valid: {failed}")
        with self.db.session() as session:
            existing = store.get_rule(session, candidate.id)
            if existing is not None:
                if existing.status == RuleStatus.REJECTED:
                    return self._refused(candidate, f"a person rejected the same rule ({existing.id}) before")
                return {"status": existing.status, "id": existing.id, "pattern": p, "note": "suggested before"}
            history = incidents.labelled_history(session)
            jobs = incidents.confirmed_jobs(session, limit=JOBS_CHECKED)
            jobs = [(job, reason_id, how, store.kept_lines(session, job.id)) for job, reason_id, how in jobs]
        rules_in_force = list(self.rulebook.diagnosis_rules)
        conflicts = history_conflicts(candidate, rules_in_force, history)
        conflicts += self._job_conflicts(candidate, rules_in_force, jobs) if not conflicts else []
        if conflicts:
            return self._refused(candidate, conflicts[0].message, conflicts=[c.message for c in conflicts])
        after = Rulebook(source=_Rules([r for r in rules_in_force if r.source != "builtin"] + [candidate]),
                         guard=self.rulebook.guard, builtin_filters=self.rulebook.builtin_filters,
                         builtin_diagnosis=self.rulebook.builtin_diagnosis)
        again = replay(after, job.meta, job.kept_lines())
        root = again.root_cause
        if root is None or rule_id_of(root.source) != candidate.id:
            got = f"{root.reason} from {root.source}" if root else "nothing"
            return self._refused(candidate, f"it does not match this case as its root cause (the rules would give {got})")
        # a rule that would blame the cluster on text no infrastructure rule recognises waits
        # for a person, whatever auto_accept says
        status = RuleStatus.ACTIVE if self.auto_accept and decision.rule_backed else RuleStatus.PENDING
        provenance = {
            "backend": decision.backend, "model": decision.backend, "decision": {
                "reason": decision.reason, "origin": decision.origin, "tier": decision.tier.value,
                "confidence": decision.confidence, "source": decision.source},
            "evidence": [line], "validation": {**validation.to_dict(), "history": f"ok: {len(history)} confirmed lines",
                                               "jobs": f"ok: {len(jobs)} confirmed jobs", "this_case": "ok"},
            "incidents": [{"id": n.incident.id, "reason": n.incident.reason, "similarity": round(n.similarity, 3)}
                          for n in retrieval.neighbours.get(decision.chunk.order, [])[:5]],
            "job": {"name": job.meta.name, "framework": job.meta.framework, "file": decision.line.source,
                    "line_number": decision.line.line_number},
        }
        # returned, not stored: the caller stores it in the job's own transaction (a rule
        # suggested for a job whose upload then fails is not left behind)
        rule = {"id": candidate.id, "kind": RuleKind.DIAGNOSIS.value, "status": status.value,
                "scope": candidate.scope, "source": candidate.source, "patterns": list(candidate.patterns),
                "reason": candidate.reason, "tier": candidate.tier.value, "origin": candidate.origin.value,
                "action": candidate.action.value, "mitigation": candidate.mitigation,
                "description": candidate.description, "provenance": provenance}
        return {"status": status.value, "id": candidate.id, "pattern": p, "rule": rule}

    def _job_conflicts(self, candidate: DiagnosisRule, rules_in_force: list[DiagnosisRule],
                       jobs: list[tuple[Any, str, str, list[KeptLine]]]) -> list[Conflict]:
        """Confirmed jobs whose diagnosis the candidate would change when they are replayed."""
        if not jobs:
            return []
        learned = [r for r in rules_in_force if r.source != "builtin"]
        common = {"guard": self.rulebook.guard, "builtin_filters": self.rulebook.builtin_filters,
                  "builtin_diagnosis": self.rulebook.builtin_diagnosis}
        before, after = Rulebook(source=_Rules(learned), **common), Rulebook(source=_Rules([*learned, candidate]), **common)
        out = []
        for job, reason_id, how, kept in jobs:
            if not kept or reason_id == candidate.reason:
                continue
            meta = JobMeta(name=job.name or "", framework=job.framework, tags=tuple(job.tags or ()))
            b, a = replay(before, meta, kept).root_cause, replay(after, meta, kept).root_cause
            if a is not None and rule_id_of(a.source) == candidate.id and (b is None or b.reason != a.reason):
                out.append(Conflict(f"job {job.id}", reason_id, candidate.reason, a.line, how))
        return out

    def _refused(self, candidate: DiagnosisRule | None, why: str, **extra: Any) -> dict[str, Any]:
        with self.db.session() as session:
            store.audit(session, ACTOR, "rule.refused", candidate.id if candidate else "", reason=why,
                        pattern=candidate.patterns[0] if candidate else None, **extra)
        out = {"status": "refused", "reason": why}
        if candidate is not None:
            out.update(id=candidate.id, pattern=candidate.patterns[0])
        return out | extra


def store_suggested_rules(session: Session, diagnosis: Diagnosis) -> list[str]:
    """Store the rules the Failure Agent suggested for this diagnosis, in the caller's
    transaction; a rule another replica stored meanwhile is left as it is. Returns the ids
    stored."""
    stored = []
    for rule in diagnosis.rules_to_store:
        if store.get_rule(session, rule["id"]) is not None:
            continue
        try:
            with session.begin_nested():
                row = store.add_rule(session, actor=ACTOR, **rule)
                if row.status == RuleStatus.ACTIVE:
                    incidents.confirm_approved_rule(session, row)
        except IntegrityError:
            continue  # suggested by another replica at the same moment: one row is enough
        stored.append(rule["id"])
    return stored


def build_failure_agent(settings: Settings, db: Database, rulebook: Rulebook, embedder: Embedder, *,
                        withheld_sources: frozenset[str], stop: threading.Event,
                        on_report: Callable[[dict[str, Any]], None] | None, closers: list) -> FailureAgent:
    """The agent from the settings: the knowledge base seeded and indexed (model loaded), the
    LLM backend when one is configured (its closer appended to `closers`), the write-back."""
    source = incidents.DbIncidents(db)
    source.seed(seed_incidents(rulebook.builtin_diagnosis, withheld_sources=withheld_sources))
    knowledge = KnowledgeBase(source, embedder, index_dir=settings.data_dir / INDEX_FOLDER, stop=stop)
    knowledge.refresh()
    llm = None
    if settings.llm_configured:
        llm = make_backend(settings.llm_base_url, settings.llm_model, settings.llm_api_key.get_secret_value(),
                           timeout_s=settings.llm_timeout_s, max_retries=settings.llm_max_retries)
        closers.append(llm.close)
    return FailureAgent(knowledge, embedder, llm=llm, attempts=settings.failure_agent_attempts,
                        max_tokens=settings.llm_max_tokens,
                        writeback=StoreWriteBack(db, rulebook, auto_accept=settings.auto_accept_rules),
                        on_report=on_report)


def new_embedder() -> Embedder:
    """The process's MiniLM, loaded on its first vector."""
    return LazyEmbedder(_load_minilm)


def _load_minilm() -> Embedder:
    from agents.vector_store import load_minilm

    return load_minilm()
