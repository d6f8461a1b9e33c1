"""The Failure Agent as a job sees it: a hook that builds the real agent on its first call.

Building it loads the embedding model, seeds the knowledge base and its FAISS index (seconds,
hundreds of MB), and importing `service.agents.failure` brings numpy and the agents' code.
A command whose log the rules resolve needs none of that, so this module imports neither
until a job asks the agent; `faultline diagnose` of a short log starts without them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.embeddings import Embedder
    from agents.failure_agent import FailureAgent
    from rules.job import JobView
    from rules.rulebook import Rulebook
    from rules.verdict import Diagnosis
    from service.settings import Settings
    from service.store.db import Database


class LazyFailureAgent:
    """A FailureAgentHook that builds the agent (model, knowledge base) on its first call."""

    def __init__(self, settings: Settings, db: Database, rulebook: Rulebook, *, embedder: Embedder | None = None,
                 on_report: Callable[[dict[str, Any]], None] | None = None,
                 withheld_sources: frozenset[str] = frozenset()):
        self.settings, self.db, self.rulebook = settings, db, rulebook
        self.withheld_sources = withheld_sources
        """Real incidents left out of the seeded knowledge (see `seed_incidents`)."""
        self.on_report = on_report
        self._embedder = embedder
        self._agent: FailureAgent | None = None
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        """Set at shutdown: a build under way stops at its next batch (agents.knowledge.Stopped)."""
        self.closers: list = []
        self.on_load: Callable[[], None] | None = None
        """Called once, before the agent (its model and knowledge base) is built: the CLI says
        so on standard error, since the first build costs seconds and hundreds of MB."""

    @property
    def embedder(self) -> Embedder:
        """The one given, else the process's own (still unloaded until a vector is asked for)."""
        if self._embedder is None:
            from service.agents.failure import new_embedder

            self._embedder = new_embedder()
        return self._embedder

    @property
    def built(self) -> bool:
        return self._agent is not None

    def agent(self) -> FailureAgent:
        with self._lock:
            if self._agent is None:
                if self.on_load is not None:
                    self.on_load()
                from service.agents.failure import build_failure_agent

                self._agent = build_failure_agent(self.settings, self.db, self.rulebook, self.embedder,
                                                  withheld_sources=self.withheld_sources, stop=self.stopping,
                                                  on_report=self.on_report, closers=self.closers)
            return self._agent

    def diagnose(self, job: JobView, diagnosis: Diagnosis) -> Diagnosis | None:
        agent = self.agent()
        agent.knowledge.refresh()  # incidents confirmed since (here or on another replica)
        return agent.diagnose(job, diagnosis)

    def close(self) -> None:
        for closer in self.closers:
            closer()
