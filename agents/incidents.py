"""A labelled failure line the Failure Agent retrieves from: the plain data type that the
store (service/store/incidents.py) and the knowledge base (agents/knowledge.py) share, without
the vector machinery (numpy, the model) that only retrieval needs."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agents.templates import mask
from rules.envelope import split_envelope


@dataclass(frozen=True, slots=True)
class Incident:
    id: str
    text: str
    reason: str
    origin: str
    tier: str
    category: str | None = None
    mitigation: str = ""
    confirmed_by: str = ""
    """`taxonomy`, `builtin_rule`, `rule:<id>`, `admin`, `label`."""
    job_id: str | None = None


def incident_id(kind: str, reason_id: str, text: str) -> str:
    """Stable id: the same failure text with the same label is one incident, however often
    it is confirmed (values such as hosts and numbers are masked out first)."""
    shape = mask(split_envelope(text).message.strip())
    digest = hashlib.sha1(f"{reason_id}\x00{shape}".encode()).hexdigest()[:20]
    return f"{kind}:{digest}"


@dataclass
class StoredIncident:
    incident: Incident
    embedding: bytes | None = None
    embedding_model: str = ""


class IncidentSource(Protocol):
    """Where incidents live (the database)."""

    def ids(self) -> list[str]:
        """Every stored incident's id, oldest first."""

    def get(self, ids: Sequence[str]) -> list[StoredIncident]:
        """These incidents, with their stored vectors, in the order given."""

    def save_embeddings(self, vectors: dict[str, bytes], model: str) -> None: ...

    def add(self, incidents: Sequence[Incident]) -> None:
        """Store new incidents (ids already stored are left as they are)."""
