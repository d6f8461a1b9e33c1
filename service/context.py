"""What a command or the app needs, built once from the settings: database, rules, agents."""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from rules.verdict import Diagnosis
from service.store import incidents
from service.store import jobs as store
from service.store.db import Database, open_database
from service.metrics import Metrics
from rules.job import FailureAgentHook, JobMeta, JobRun, LogAgentHook
from rules.rulebook import Rulebook
from service.settings import Settings

if TYPE_CHECKING:
    from service.admin.review import Review

log = logging.getLogger("faultline.diagnosis")


@dataclass
class Context:
    settings: Settings
    db: Database
    rulebook: Rulebook
    log_agent_factory: object | None = None
    log_agent_impl: Any = None
    """The process-wide Log Agent (agents.log_agent.LogAgent), to resume a live job's agent."""
    failure_agent: FailureAgentHook | None = None
    closers: list = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    _review: Review | None = field(default=None, repr=False)
    _review_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _started: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False)
    """When each run began (time.monotonic), for the seconds of its diagnosis line."""
    learn: bool = True
    """False (`--no-learn`): rules learned or suggested in a run stay in that run, and nothing
    of the run is written to the store (rule hits, suggested rules, incidents)."""

    @classmethod
    @contextmanager
    def open(cls, settings: Settings, **options: object) -> Iterator[Context]:
        ctx = cls.build(settings, **options)
        try:
            yield ctx
        finally:
            ctx.close()

    @classmethod
    def build(cls, settings: Settings, *, metrics: Metrics | None = None, embedder: object | None = None,
              learn: bool = True, withheld_sources: frozenset[str] = frozenset()) -> Context:
        """Everything a command or the app needs. `embedder` lets tests share one loaded
        model; otherwise the Failure Agent loads its own, on first use. `learn=False`: the
        store is only read (see `Context.learn`). `withheld_sources`: real incidents the
        Failure Agent's knowledge leaves out (`faultline eval`)."""
        db = open_database(settings)
        rulebook = Rulebook(source=store.RuleStore(db))
        metrics = metrics or Metrics()
        ctx = cls(settings=settings, db=db, rulebook=rulebook, metrics=metrics, learn=learn)
        if settings.log_agent:
            from service.agents.log import build_log_agent

            agent, closers = build_log_agent(settings, db, rulebook, on_report=metrics.log_agent_report,
                                             persist=learn)
            ctx.log_agent_factory = agent.for_job
            ctx.log_agent_impl = agent
            ctx.closers.extend(closers)
        if settings.failure_agent:
            from service.agents.failure_hook import LazyFailureAgent

            lazy = LazyFailureAgent(settings, db, rulebook, embedder=embedder, on_report=metrics.failure_agent_report,
                                    withheld_sources=withheld_sources)
            ctx.failure_agent = lazy
            ctx.closers.append(lazy.close)
        return ctx

    @property
    def review(self) -> Review:
        """The admin's review of rules (validation, import, dry-run), built on first use: a
        diagnose on the command line never needs it, and its import costs a start-up."""
        with self._review_lock:
            if self._review is None:
                from service.admin.review import Review

                self._review = Review(self.rulebook, metrics=self.metrics)
            return self._review

    def log_agent(self, meta: JobMeta) -> LogAgentHook | None:
        if not self.settings.log_agent or self.log_agent_factory is None:
            return None
        return self.log_agent_factory(meta)

    def resume_log_agent(self, state: dict[str, Any] | None) -> LogAgentHook | None:
        """A live job's Log Agent from its saved state (None: the job runs without one)."""
        if state is None or not self.settings.log_agent or self.log_agent_impl is None:
            return None
        return self.log_agent_impl.resume(state)

    def new_run(self, meta: JobMeta, *, diagnose: bool = True) -> JobRun:
        """A job run with the agents in force; `diagnose=False` (compress) leaves the Failure
        Agent out: only the kept lines are wanted, and its model costs seconds to load."""
        self.rulebook.refresh()
        agent = self.failure_agent if self.settings.failure_agent and diagnose else None
        run = JobRun(self.rulebook, meta, log_agent=self.log_agent(meta), failure_agent=agent,
                     node_files=self.settings.node_file_pattern)
        self._started[run] = time.monotonic()
        return run

    def after_run(self, run: JobRun, diagnosis: Diagnosis, *, entry: str = "cli",
                  session: Session | None = None, job_id: str | None = None) -> None:
        """Count rule hits and metrics, store the diagnosis rules the Failure Agent suggested
        (in `session` when the caller stores the job in the same transaction); a failure a
        rule resolved with confidence joins the Failure Agent's knowledge base (as text: no
        model is loaded for it). The Log Agent persists its filter rules itself."""
        result = diagnosis.to_dict()
        self.metrics.observe_diagnosis(result, entry=entry)
        root = result.get("root_cause") or {}
        # one line per diagnosis, key=value, for the operator's log search (what the metrics
        # count, per job); the log's own text is never in it
        started = self._started.pop(run, None)
        log.info("diagnosis entry=%s job=%s name=%s status=%s reason=%s origin=%s action=%s source=%s lines=%d "
                 "seconds=%s", entry, job_id or "-", json.dumps(run.meta.name or ""), result["status"],
                 root.get("reason") or "-", root.get("origin") or "-", result.get("action") or "-",
                 root.get("source") or "-", sum(src.stream.lines_in for src in run.sources.values()),
                 "-" if started is None else f"{time.monotonic() - started:.3f}")
        if not self.learn:
            return
        hits: dict[str, int] = {}
        for source in run.sources.values():
            for rule_id, stats in source.stream.rule_stats().items():
                hits[rule_id] = hits.get(rule_id, 0) + stats.count
        for found in run.classifier.found.values():
            hits[found.rule.id] = hits.get(found.rule.id, 0) + found.count
        if session is not None:
            self._record(session, diagnosis, result, hits, job_id)
            return
        with self.db.session() as own:
            self._record(own, diagnosis, result, hits, job_id)

    def _record(self, session: Session, diagnosis: Diagnosis, result: dict[str, Any], hits: dict[str, int],
                job_id: str | None) -> None:
        store.add_hits(session, hits)
        if diagnosis.rules_to_store:
            from service.agents.failure import store_suggested_rules

            store_suggested_rules(session, diagnosis)
        self._confirm(session, result, job_id)

    def _confirm(self, session: Session, result: dict[str, Any], job_id: str | None) -> None:
        if self.settings.failure_agent:
            rules = {r.id: r for r in self.rulebook.diagnosis_rules}
            incidents.confirm_rule_diagnosis(session, result, rules, job_id=job_id)

    def close(self) -> None:
        for closer in reversed(self.closers):
            closer()
        self.db.close()
