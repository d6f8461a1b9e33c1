"""The Failure Agent's knowledge base: past incidents, their vectors, and the vote over them.

An incident is an error text with how it was diagnosed and fixed: reason, category, origin,
tier (how strongly such a line explains a failure), mitigation, and how it was confirmed.
The base starts from the taxonomy (`rules/packs/reasons.yaml`) and the built-in diagnosis
rules (descriptions and example lines), and grows with every confirmed diagnosis: a
diagnosis a rule resolved, a suggested rule a person approved, an admin's confirmation.

Incidents live in the database with their vectors (`IncidentSource`); `KnowledgeBase`
holds them in a FAISS index, reloads a saved index when it still matches the database,
rebuilds it from the stored vectors when it does not (no embedding again), and embeds only
incidents that have no vector for this model yet.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from agents.embeddings import Embedder, embedding_text, from_bytes, to_bytes
from agents.incidents import Incident, IncidentSource, StoredIncident, incident_id
from rules.model import TIER_RANK, DiagnosisRule, Tier
from rules.builtin import PACKS_DIR
from rules.packs import SAFE_LOADER
from rules.taxonomy import REASONS, reason

REASONS_FILE = PACKS_DIR / "reasons.yaml"
REAL_INCIDENTS_FILE = PACKS_DIR.parent / "corpus" / "real_incidents.jsonl"
NEIGHBOURS = 8
VOTE_SHARPNESS = 20.0
"""Weight of a neighbour is exp(sharpness * similarity): a close match outweighs several
loose ones (0.1 more similarity is worth e^2 = 7.4 times the weight)."""


@dataclass(frozen=True, slots=True)
class Neighbour:
    incident: Incident
    similarity: float


@dataclass(frozen=True)
class Vote:
    """The similarity-weighted vote of a line's nearest incidents."""

    reason: str
    origin: str
    tier: Tier
    share: float
    """Weight of the winning reason over all the weight (0..1)."""
    similarity: float
    """Similarity of the closest incident of the winning reason."""
    neighbours: tuple[Neighbour, ...] = ()
    runner_up: str | None = None

    @property
    def confidence(self) -> float:
        return round(max(0.0, min(1.0, self.share * self.similarity)), 2)


def reason_tier(reason_id: str, rules: Sequence[DiagnosisRule]) -> Tier:
    """How strongly a line of this reason explains a failure when no rule says: the highest
    tier of the built-in rules of the reason (context excluded)."""
    tiers = [r.tier for r in rules if r.reason == reason_id and r.tier is not Tier.CONTEXT]
    return max(tiers, key=lambda t: TIER_RANK[t]) if tiers else Tier.CAUSE


def load_reason_descriptions(path: Path = REASONS_FILE) -> dict[str, str]:
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER) or {}
    out = {str(k): " ".join(str(v).split()) for k, v in (data.get("reasons") or {}).items()}
    unknown = sorted(set(out) - set(REASONS))
    if unknown:
        raise ValueError(f"{path.name}: unknown reasons {unknown}")
    return out


def description_signs(description: str) -> list[str]:
    """A description cut into short texts: each sentence, and each item of a list after a
    colon. A short text embeds its one idea; a paragraph's vector is the blur of several."""
    out: list[str] = []
    for sentence in (s.strip() for s in description.replace(". ", ".\n").splitlines()):
        if not sentence:
            continue
        head, colon, tail = sentence.partition(": ")
        out.append(head.rstrip("."))
        if colon:
            out += [item.strip().rstrip(".") for item in tail.replace("; ", ", ").split(", ") if item.strip()]
    return [s for s in out if len(s) > 3]


def load_real_incidents(path: Path = REAL_INCIDENTS_FILE) -> list[dict]:
    """Root-cause lines of real failures people posted, labelled from how their threads
    resolved them (the development split of fixtures/real; `python -m fixtures.real.merge`
    writes it). A missing file leaves the rest of the knowledge."""
    if not path.is_file():
        return []
    items = [json.loads(raw) for raw in path.read_text(encoding="utf-8").splitlines() if raw.strip()]
    return [item for item in items if item.get("reason") in REASONS and item.get("line")]


def seed_incidents(rules: Sequence[DiagnosisRule], descriptions: dict[str, str] | None = None, *,
                   withheld_sources: frozenset[str] = frozenset()) -> list[Incident]:
    """The starting knowledge: one description per reason, the root-cause lines of real
    failures, and each built-in rule's description and example lines (context rules
    excluded: they never name a cause). Real lines whose `source` is withheld stay out:
    `faultline eval` withholds the logs it scores, so no log is its own nearest neighbour."""
    descriptions = load_reason_descriptions() if descriptions is None else descriptions
    out: dict[str, Incident] = {}

    def add(kind: str, text: str, reason_id: str, origin: str, tier: Tier, mitigation: str, confirmed_by: str) -> None:
        entry = reason(reason_id)
        item = Incident(incident_id(kind, reason_id, text), text, reason_id, origin, tier.value,
                        entry.category.value if entry.category else None, mitigation, confirmed_by)
        out.setdefault(item.id, item)

    for reason_id, entry in REASONS.items():
        tier = reason_tier(reason_id, rules)
        words = reason_id.replace("_", " ")
        add("taxonomy", f"{words}: {entry.summary}", reason_id, entry.origin.value, tier, entry.mitigation, "taxonomy")
        for sign in description_signs(descriptions.get(reason_id, "")):
            add("taxonomy", f"{words}: {sign}", reason_id, entry.origin.value, tier, entry.mitigation, "taxonomy")
    for item in load_real_incidents():
        if item.get("source") in withheld_sources:
            continue
        entry = reason(item["reason"])
        origin = item["origin"] if item["origin"] != "unknown" else entry.origin.value
        add("real", item["line"], item["reason"], origin, reason_tier(item["reason"], rules), entry.mitigation,
            "real_corpus")
    for rule in rules:
        if rule.tier is Tier.CONTEXT or rule.source != "builtin":
            continue
        mitigation = rule.mitigation or reason(rule.reason).mitigation
        if rule.description:
            add("description", rule.description, rule.reason, rule.origin.value, rule.tier, mitigation, "description")
        for example in rule.examples:
            add("builtin", example, rule.reason, rule.origin.value, rule.tier, mitigation, "builtin_rule")
    return list(out.values())


def vote(neighbours: Sequence[Neighbour], *, sharpness: float = VOTE_SHARPNESS) -> Vote | None:
    """Similarity-weighted vote over neighbours: weights exp(sharpness * similarity) are
    summed per reason; the tier and origin are those most weighted within the winner."""
    if not neighbours:
        return None
    top = max(n.similarity for n in neighbours)
    weights: dict[str, float] = {}
    for n in neighbours:
        weights[n.incident.reason] = weights.get(n.incident.reason, 0.0) + float(np.exp(sharpness * (n.similarity - top)))
    ranked = sorted(weights, key=lambda r: -weights[r])
    winner = ranked[0]
    total = sum(weights.values())
    mine = [n for n in neighbours if n.incident.reason == winner]
    tier_w: dict[str, float] = {}
    origin_w: dict[str, float] = {}
    for n in mine:
        w = float(np.exp(sharpness * (n.similarity - top)))
        tier_w[n.incident.tier] = tier_w.get(n.incident.tier, 0.0) + w
        origin_w[n.incident.origin] = origin_w.get(n.incident.origin, 0.0) + w
    return Vote(reason=winner, origin=max(origin_w, key=origin_w.__getitem__),
                tier=Tier(max(tier_w, key=tier_w.__getitem__)), share=weights[winner] / total,
                similarity=max(n.similarity for n in mine), neighbours=tuple(neighbours),
                runner_up=ranked[1] if len(ranked) > 1 else None)


# -- storage -----------------------------------------------------------------------------------
class MemoryIncidents:
    """An IncidentSource in memory, for tests and benchmarks."""

    def __init__(self, items: Iterable[Incident] = ()):
        self.rows: dict[str, StoredIncident] = {i.id: StoredIncident(i) for i in items}
        self.embedded = 0

    def ids(self) -> list[str]:
        return list(self.rows)

    def get(self, ids: Sequence[str]) -> list[StoredIncident]:
        return [self.rows[i] for i in ids if i in self.rows]

    def save_embeddings(self, vectors: dict[str, bytes], model: str) -> None:
        for key, data in vectors.items():
            row = self.rows[key]
            row.embedding, row.embedding_model = data, model
        self.embedded += len(vectors)

    def add(self, incidents: Sequence[Incident]) -> None:
        for item in incidents:
            self.rows.setdefault(item.id, StoredIncident(item))


EMBED_BATCH = 256
"""Incidents embedded between two looks at `KnowledgeBase.stop` (a second or two of CPU)."""


class Stopped(RuntimeError):
    """The process is shutting down: the knowledge base was left part-built."""


@dataclass
class KnowledgeBase:
    """Incidents and their FAISS index; `refresh()` brings the index up to the source."""

    source: IncidentSource
    embedder: Embedder
    index_dir: Path | None = None
    """Where the index is saved and reloaded from (None: memory only)."""
    incidents: dict[str, Incident] = field(default_factory=dict)
    embedded_now: int = 0
    """Incidents this process had to embed (the rest came with stored vectors)."""
    stop: threading.Event | None = None
    """Set when the process shuts down: embedding stops between batches (Stopped), what was
    embedded so far stays stored, and the next start goes on from there."""
    _index: object | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def index(self):
        if self._index is None:
            self.refresh()
        return self._index

    def refresh(self) -> int:
        """Load what the source has that the index lacks; returns how many were added."""
        from agents.vector_store import FaissIndex

        with self._lock:
            stored = self.source.ids()
            if self._index is None and self.index_dir is not None:
                self._index = FaissIndex.load(self.index_dir, model=self.embedder.model_name, dim=self.embedder.dim)
                if self._index is not None and not set(self._index.ids) <= set(stored):
                    self._index = None  # the database was replaced: rebuild from it
            if self._index is None:
                self._index = FaissIndex(self.embedder.dim, model=self.embedder.model_name)
            missing = [i for i in stored if i not in self.incidents]
            if missing:  # incidents the index already holds (a saved index) still need their labels
                self.incidents.update((r.incident.id, r.incident) for r in self.source.get(missing))
            known = set(self._index.ids)
            new = [self.incidents[i] for i in stored if i not in known and i in self.incidents]
            if not new:
                return 0
            rows = {r.incident.id: r for r in self.source.get([i.id for i in new])}
            vectors = self._vectors([rows[i.id] for i in new])
            self._index.add([i.id for i in new], vectors)
            if self.index_dir is not None:
                self._index.save(self.index_dir)
            return len(new)

    def _vectors(self, rows: Sequence[StoredIncident]) -> np.ndarray:
        """Stored vectors where the model matches; the others are embedded and stored."""
        out = np.zeros((len(rows), self.embedder.dim), dtype=np.float32)
        missing = []
        for i, row in enumerate(rows):
            vector = from_bytes(row.embedding, self.embedder.dim) if row.embedding_model == self.embedder.model_name else None
            if vector is None:
                missing.append(i)
            else:
                out[i] = vector
        for start in range(0, len(missing), EMBED_BATCH):
            if self.stop is not None and self.stop.is_set():
                raise Stopped(f"stopped after embedding {start} of {len(missing)} incidents")
            batch = missing[start:start + EMBED_BATCH]
            fresh = self.embedder.embed([embedding_text(rows[i].incident.text) for i in batch])
            out[batch] = fresh
            self.source.save_embeddings({rows[i].incident.id: to_bytes(v) for i, v in zip(batch, fresh, strict=True)},
                                        self.embedder.model_name)
            self.embedded_now += len(batch)
        return out

    def add(self, incidents: Sequence[Incident]) -> int:
        self.source.add(incidents)
        return self.refresh()

    def neighbours(self, vectors: np.ndarray, k: int = NEIGHBOURS) -> list[list[Neighbour]]:
        index = self.index
        with self._lock:  # FAISS may not be searched while refresh() adds to it
            scores, ids = index.search(vectors, k)
        return [[Neighbour(self.incidents[i], float(s)) for i, s in zip(row_ids, row_scores, strict=False)
                 if i in self.incidents] for row_ids, row_scores in zip(ids, scores, strict=True)]


