"""What the Log Agent needs from the service: the rule store as its sink, and the agent
built from the settings (LLM backend when one is configured, else the embedded miner)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError

from agents.llm import make_backend
from agents.log_agent import LogAgent, LogAgentConfig, MemorySink
from agents.proposals import LLMProposalBackend, ProposalBackend
from rules.model import FilterRule, RuleKind
from service.store import jobs as store
from service.store.db import Database
from rules.rulebook import Rulebook
from service.settings import Settings

ACTOR = "log_agent"


class StoreSink:
    """Learned filter rules go to the `rules` table, with their provenance and an audit entry."""

    def __init__(self, db: Database):
        self.db = db

    def status_of(self, rule_id: str) -> str | None:
        with self.db.session() as session:
            row = store.get_rule(session, rule_id)
            return row.status if row is not None else None

    def save(self, rule: FilterRule, *, status: str, provenance: dict[str, Any]) -> None:
        try:
            with self.db.session() as session:
                if store.get_rule(session, rule.id) is not None:
                    return
                store.add_rule(session, actor=ACTOR, id=rule.id, kind=RuleKind.FILTER.value, status=status,
                               scope=rule.scope, source=rule.source, pattern=rule.pattern,
                               description=rule.description, provenance=provenance)
        except IntegrityError:
            # another request or replica learned the same rule (same id) at the same moment
            return


class ReadOnlySink(StoreSink):
    """`--no-learn`: what the store says of a rule (a rejected one stays rejected) is read,
    and what is learned stays in memory."""

    def __init__(self, db: Database):
        super().__init__(db)
        self.memory = MemorySink()

    def status_of(self, rule_id: str) -> str | None:
        return self.memory.status_of(rule_id) or super().status_of(rule_id)

    def save(self, rule: FilterRule, *, status: str, provenance: dict[str, Any]) -> None:
        self.memory.save(rule, status=status, provenance=provenance)


def agent_config(settings: Settings) -> LogAgentConfig:
    return LogAgentConfig(
        votes=settings.log_agent_votes, agreement=settings.log_agent_agreement,
        segment_lines=settings.log_agent_segment_lines, segment_bytes=settings.log_agent_segment_bytes,
        segment_seconds=settings.log_agent_segment_seconds, min_support=settings.log_agent_min_support,
        max_rules=settings.log_agent_max_rules)


def build_log_agent(settings: Settings, db: Database, rulebook: Rulebook, *,
                    on_report: Any = None, persist: bool = True) -> tuple[LogAgent, list]:
    """The Log Agent and what must be closed with it; `persist=False` keeps what it learns in
    memory (the run still uses it) and writes nothing to the store."""
    closers: list = []
    backend_factory = None
    if settings.llm_configured:
        llm = make_backend(settings.llm_base_url, settings.llm_model, settings.llm_api_key.get_secret_value(),
                           timeout_s=settings.llm_timeout_s, max_retries=settings.llm_max_retries)
        closers.append(llm.close)

        def backend_factory() -> ProposalBackend:
            return LLMProposalBackend(llm, temperature=settings.log_agent_temperature,
                                      max_tokens=settings.llm_max_tokens,
                                      prompt_tokens=settings.log_agent_prompt_tokens,
                                      max_calls=settings.log_agent_max_llm_calls)

    agent = LogAgent(
        agent_config(settings), backend=backend_factory, sink=StoreSink(db) if persist else ReadOnlySink(db), guard=rulebook.guard,
        builtin_examples=[e for r in rulebook.filter_rules if r.source == "builtin" for e in r.examples],
        evidence_examples=[e for r in rulebook.diagnosis_rules for e in r.examples], on_report=on_report)
    return agent, closers
