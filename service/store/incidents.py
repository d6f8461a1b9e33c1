"""The knowledge base's incidents in the database, and how confirmed diagnoses become ones.

Three ways a diagnosis is confirmed and joins the knowledge base:
- a rule resolved it with confidence (`confirm_rule_diagnosis`, every job, no model needed:
  the vector is made later, when the Failure Agent next loads its index);
- a person approved a diagnosis rule the agent suggested (`confirm_approved_rule`);
- an admin confirmed (or corrected) a stored job's diagnosis (`confirm_job`).
Incidents are deduplicated by their text's shape and label (`agents.knowledge.incident_id`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.incidents import Incident, StoredIncident, incident_id
from agents.writeback import LabelledLine
from rules.model import DiagnosisRule, RuleKind, Tier
from rules.taxonomy import REASONS, Origin, reason
from rules.verdict import CONFIDENT, rule_id_of, rule_source
from service.store import jobs as store
from service.store.db import Database
from service.errors import NotFound, Unprocessable
from service.store.models import Incident as IncidentRow
from service.store.models import Job, RuleRow
from rules.redact import redact_text

MAX_TEXT_CHARS = 4000
HISTORY_LINES = 20_000


def row_to_incident(row: IncidentRow) -> Incident:
    return Incident(id=row.id, text=row.text, reason=row.reason, origin=row.origin, tier=row.tier or "cause",
                    category=row.category, mitigation=row.mitigation or "", confirmed_by=row.confirmed_by or "",
                    job_id=row.job_id)


def add_incidents(session: Session, incidents: Sequence[Incident]) -> int:
    """Store incidents whose id is new; returns how many were added.

    Replicas confirm the same failure at the same moment (two uploads of one job's log): a
    look-then-insert let both insert, and the loser's upload failed with a duplicate key. The
    insert itself skips an id that is there already, in the same statement.
    """
    rows: dict[str, dict[str, Any]] = {}
    for item in incidents:
        rows.setdefault(item.id, {
            "id": item.id, "text": item.text[:MAX_TEXT_CHARS], "reason": item.reason, "category": item.category,
            "origin": item.origin, "tier": item.tier, "mitigation": item.mitigation,
            "confirmed_by": item.confirmed_by, "job_id": item.job_id,
        })
    if not rows:
        return 0
    dialect = session.get_bind().dialect.name
    # the dialects' insert is imported here: PostgreSQL's brings asyncio and asyncpg's module
    # into every short `faultline diagnose` on SQLite (25 ms of its start)
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        statement = postgresql.insert(IncidentRow).on_conflict_do_nothing(index_elements=["id"])
    elif dialect == "sqlite":
        from sqlalchemy.dialects import sqlite

        statement = sqlite.insert(IncidentRow).on_conflict_do_nothing(index_elements=["id"])
    else:  # no portable ON CONFLICT: look, then insert (the race above stays possible there)
        known = set(session.scalars(select(IncidentRow.id).where(IncidentRow.id.in_(list(rows)))).all())
        session.add_all(IncidentRow(**row) for key, row in rows.items() if key not in known)
        session.flush()
        return len(rows) - len(known)
    # RETURNING lists the rows inserted, not the ones skipped (both PostgreSQL and SQLite >= 3.35)
    return len(session.execute(statement.values(list(rows.values())).returning(IncidentRow.id)).all())


class DbIncidents:
    """The database as the knowledge base's IncidentSource."""

    def __init__(self, db: Database):
        self.db = db

    def ids(self) -> list[str]:
        with self.db.session() as session:
            return list(session.scalars(select(IncidentRow.id).order_by(IncidentRow.created_at, IncidentRow.id)).all())

    def get(self, ids: Sequence[str]) -> list[StoredIncident]:
        out: dict[str, StoredIncident] = {}
        with self.db.session() as session:
            for start in range(0, len(ids), 500):
                for r in session.scalars(select(IncidentRow).where(IncidentRow.id.in_(ids[start:start + 500]))):
                    out[r.id] = StoredIncident(row_to_incident(r), r.embedding, r.embedding_model or "")
        return [out[i] for i in ids if i in out]

    def save_embeddings(self, vectors: dict[str, bytes], model: str) -> None:
        with self.db.session() as session:
            for key, data in vectors.items():
                row = session.get(IncidentRow, key)
                if row is not None:
                    row.embedding, row.embedding_model = data, model

    def add(self, incidents: Sequence[Incident]) -> None:
        with self.db.session() as session:
            add_incidents(session, incidents)

    def seed(self, incidents: Sequence[Incident]) -> int:
        with self.db.session() as session:
            return add_incidents(session, incidents)


def labelled_history(session: Session, *, limit: int = HISTORY_LINES) -> list[LabelledLine]:
    """Confirmed lines with their reasons: built-in rule examples and confirmed root causes
    (descriptions are not lines and are left out)."""
    rows = session.scalars(select(IncidentRow).where(IncidentRow.confirmed_by.not_in(("taxonomy", "description")))
                           .order_by(IncidentRow.created_at.desc()).limit(limit)).all()
    return [LabelledLine(r.text, r.reason, r.confirmed_by, f"job {r.job_id}" if r.job_id else f"incident {r.id}")
            for r in rows]


def confirmed_jobs(session: Session, *, limit: int = 200) -> list[tuple[Job, str, str]]:
    """Stored jobs whose diagnosis was confirmed: (job, confirmed reason, how)."""
    rows = session.execute(select(Job, IncidentRow.reason, IncidentRow.confirmed_by)
                           .join(IncidentRow, IncidentRow.job_id == Job.id)
                           .order_by(IncidentRow.created_at.desc()).limit(limit)).all()
    seen: set[str] = set()
    out = []
    for job, reason_id, how in rows:
        if job.id not in seen:
            seen.add(job.id)
            out.append((job, reason_id, how))
    return out


# -- confirmations ---------------------------------------------------------------------------------
def incident_from_root(root: dict[str, Any], mitigation: str, *, confirmed_by: str, tier: str,
                       job_id: str | None = None, kind: str = "confirmed") -> Incident | None:
    reason_id = root.get("reason")
    line = redact_text((root.get("line") or "").strip())  # kept lines are redacted already; a person's are not
    if not line or reason_id not in REASONS:
        return None
    entry = reason(reason_id)
    return Incident(incident_id(kind, reason_id, line), line, reason_id, root.get("origin") or entry.origin.value,
                    tier, entry.category.value if entry.category else None, mitigation or entry.mitigation,
                    confirmed_by, job_id)


def confirm_rule_diagnosis(session: Session, diagnosis: dict[str, Any], rules: dict[str, DiagnosisRule], *,
                           job_id: str | None = None) -> Incident | None:
    """A failure a rule resolved with confidence joins the knowledge base (no vector yet)."""
    root = diagnosis.get("root_cause") or {}
    source = root.get("source") or ""
    if diagnosis.get("status") != "failed" or rule_id_of(source) is None or (root.get("confidence") or 0) < CONFIDENT:
        return None
    rule = rules.get(source[5:])
    if rule is None or rule.tier in (Tier.CONTEXT, Tier.SYMPTOM):
        return None
    item = incident_from_root(root, diagnosis.get("mitigation") or "", confirmed_by=source, tier=rule.tier.value,
                              job_id=job_id)
    if item is not None:
        add_incidents(session, [item])
    return item


def confirm_approved_rule(session: Session, row: RuleRow) -> list[Incident]:
    """An approved diagnosis rule's evidence lines join the knowledge base, with its label."""
    if row.kind != RuleKind.DIAGNOSIS or not row.reason or row.reason not in REASONS:
        return []
    evidence = [e for e in (row.provenance or {}).get("evidence") or [] if isinstance(e, str) and e.strip()]
    job_id = ((row.provenance or {}).get("job") or {}).get("id")
    items = [item for item in (incident_from_root({"reason": row.reason, "origin": row.origin, "line": line},
                                                  row.mitigation, confirmed_by=rule_source(row.id),
                                                  tier=row.tier or "cause", job_id=job_id)
                               for line in evidence[:20]) if item is not None]
    add_incidents(session, items)
    return items


def confirm_job(session: Session, job_id: str, *, actor: str, reason_id: str | None = None,
                origin: str | None = None, line: str | None = None, note: str = "") -> Incident:
    """An admin confirms a stored job's diagnosis, or corrects its reason, origin or line."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    root = dict((job.diagnosis or {}).get("root_cause") or {})
    if reason_id is not None:
        if reason_id not in REASONS:
            raise Unprocessable(f"unknown reason {reason_id!r} (see the taxonomy)")
        root["reason"] = reason_id
        root["origin"] = origin or reason(reason_id).origin.value
    if origin is not None:
        if origin not in {o.value for o in Origin}:
            raise Unprocessable(f"origin must be one of {', '.join(o.value for o in Origin)}")
        root["origin"] = origin
    if line is not None:
        root["line"] = line
    if not root.get("line") or root.get("reason") not in REASONS:
        raise Unprocessable("the job has no root-cause line and reason to confirm: give `reason` and `line`")
    from agents.knowledge import reason_tier
    from rules.builtin import builtin_diagnosis_rules

    tier = reason_tier(root["reason"], builtin_diagnosis_rules()).value
    item = incident_from_root(root, (job.diagnosis or {}).get("mitigation") or "", confirmed_by="admin", tier=tier,
                              job_id=job.id, kind="admin")
    assert item is not None
    add_incidents(session, [item])
    job.meta = {**(job.meta or {}), "confirmed": {"by": actor, "reason": item.reason, "origin": item.origin,
                                                   "line": item.text, "note": note}}
    store.audit(session, actor, "job.confirm", job.id, reason=item.reason, origin=item.origin,
                corrected=reason_id is not None or origin is not None or line is not None, note=note)
    return item
