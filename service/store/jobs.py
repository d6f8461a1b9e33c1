"""Reading and writing rules and jobs. Functions take a session; only routes speak HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from rules.model import DiagnosisRule, FilterRule, KeptLine, RuleKind, RuleStatus, Tier
from rules.taxonomy import Action, Origin
from service.store.db import Database
from service.store.models import AuditEntry, Counter, Job, KeptLineRow, RuleRow, RuleVersion, utcnow

RULES_COUNTER = "rules_version"
KEPT_LINES_PER_JOB = 50_000


# -- rules ---------------------------------------------------------------------------------
def rule_to_dict(row: RuleRow) -> dict[str, Any]:
    data = {
        "id": row.id, "kind": row.kind, "status": row.status, "scope": row.scope, "source": row.source,
        "pattern": row.pattern, "description": row.description, "provenance": row.provenance or {},
        "hits": row.hits, "version": row.version, "review_note": row.review_note,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "updated_at": row.updated_at.isoformat() if row.updated_at else None,
    }
    if row.kind == RuleKind.DIAGNOSIS:
        data.update(patterns=list(row.patterns or [row.pattern]), reason=row.reason, tier=row.tier,
                    origin=row.origin, action=row.action, mitigation=row.mitigation)
    return data


def row_to_filter_rule(row: RuleRow) -> FilterRule:
    return FilterRule(id=row.id, pattern=row.pattern, description=row.description, scope=row.scope,
                      source=row.source, trusted=False)


def row_to_diagnosis_rule(row: RuleRow) -> DiagnosisRule:
    return DiagnosisRule(
        id=row.id, reason=row.reason or "unknown", tier=Tier(row.tier or "cause"),
        patterns=tuple(row.patterns or [row.pattern]), origin=Origin(row.origin or "unknown"),
        action=Action(row.action or "investigate"), mitigation=row.mitigation, description=row.description,
        scope=row.scope, source=row.source,
    )


def bump_rules_version(session: Session) -> None:
    counter = session.get(Counter, RULES_COUNTER)
    if counter is None:
        session.add(Counter(name=RULES_COUNTER, value=1))
    else:
        session.execute(update(Counter).where(Counter.name == RULES_COUNTER).values(value=Counter.value + 1))


def rules_version(session: Session) -> int:
    return session.scalar(select(Counter.value).where(Counter.name == RULES_COUNTER)) or 0


def audit(session: Session, actor: str, action: str, target: str, **details: Any) -> None:
    session.add(AuditEntry(actor=actor, action=action, target=target, details=details))


def _snapshot(session: Session, row: RuleRow, actor: str, change: str) -> None:
    session.add(RuleVersion(rule_id=row.id, version=row.version, data=rule_to_dict(row), changed_by=actor, change=change))


def add_rule(session: Session, *, actor: str, **fields: Any) -> RuleRow:
    """Store a new rule (a suggestion unless status says otherwise)."""
    fields.setdefault("id", f"{fields.get('kind', 'rule')}-{uuid.uuid4().hex[:10]}")
    fields.setdefault("status", RuleStatus.PENDING.value)
    if fields.get("kind") == RuleKind.DIAGNOSIS and not fields.get("pattern"):
        fields["pattern"] = (fields.get("patterns") or [""])[0]
    row = RuleRow(**fields)
    session.add(row)
    session.flush()
    _snapshot(session, row, actor, "created")
    audit(session, actor, "rule.create", row.id, kind=row.kind, status=row.status, source=row.source)
    if row.status == RuleStatus.ACTIVE:
        bump_rules_version(session)
    return row


def get_rule(session: Session, rule_id: str) -> RuleRow | None:
    return session.get(RuleRow, rule_id)


def list_rules(session: Session, *, kind: str | None = None, status: str | None = None,
               scope: str | None = None, source: str | None = None,
               limit: int = 100, offset: int = 0) -> tuple[list[RuleRow], int]:
    query = select(RuleRow)
    for column, value in ((RuleRow.kind, kind), (RuleRow.status, status), (RuleRow.scope, scope)):
        if value:
            query = query.where(column == value)
    if source:
        query = query.where(RuleRow.source.startswith(source))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(RuleRow.created_at.desc(), RuleRow.id).limit(limit).offset(offset)).all()
    return list(rows), total


def set_rule_status(session: Session, row: RuleRow, status: RuleStatus, *, actor: str, note: str = "") -> RuleRow:
    was_active = row.status == RuleStatus.ACTIVE
    row.status = status.value
    row.review_note = note
    row.version += 1
    session.flush()
    _snapshot(session, row, actor, status.value)
    audit(session, actor, f"rule.{status.value}", row.id, note=note)
    if was_active or status is RuleStatus.ACTIVE:
        bump_rules_version(session)
    return row


def edit_rule(session: Session, row: RuleRow, changes: dict[str, Any], *, actor: str) -> RuleRow:
    for key, value in changes.items():
        setattr(row, key, value)
    row.version += 1
    session.flush()
    _snapshot(session, row, actor, "edited")
    audit(session, actor, "rule.edit", row.id, fields=sorted(changes))
    if row.status == RuleStatus.ACTIVE:
        bump_rules_version(session)
    return row


def rule_history(session: Session, rule_id: str) -> list[RuleVersion]:
    return list(session.scalars(select(RuleVersion).where(RuleVersion.rule_id == rule_id)
                                .order_by(RuleVersion.version, RuleVersion.id)).all())


def audit_entries(session: Session, *, target: str | None = None, actor: str | None = None,
                  action: str | None = None, limit: int = 100, offset: int = 0) -> tuple[list[AuditEntry], int]:
    """Audit entries, newest first; `action` matches a prefix (`rule.` finds every rule action)."""
    query = select(AuditEntry)
    if target:
        query = query.where(AuditEntry.target == target)
    if actor:
        query = query.where(AuditEntry.actor == actor)
    if action:
        query = query.where(AuditEntry.action.startswith(action))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(AuditEntry.id.desc()).limit(limit).offset(offset)).all()
    return list(rows), total


SIGN_OUT = "admin.sign_out"


def session_ended(session: Session, ref: str) -> bool:
    """Whether an admin web session was signed out (its ref in the audit log)."""
    return session.scalar(select(AuditEntry.id).where(AuditEntry.action == SIGN_OUT, AuditEntry.target == ref)
                          .limit(1)) is not None


def audit_to_dict(entry: AuditEntry) -> dict[str, Any]:
    return {"id": entry.id, "at": entry.at.isoformat() if entry.at else None, "actor": entry.actor,
            "action": entry.action, "target": entry.target, "details": entry.details or {}}


def version_to_dict(version: RuleVersion) -> dict[str, Any]:
    return {"version": version.version, "change": version.change, "changed_by": version.changed_by,
            "changed_at": version.changed_at.isoformat() if version.changed_at else None, "data": version.data}


def error_lines(session: Session, *, limit: int = 5000) -> list[str]:
    """The most recent error-like kept lines of stored jobs."""
    return list(session.scalars(select(KeptLineRow.text).where(KeptLineRow.error_like.is_(True))
                                .order_by(KeptLineRow.id.desc()).limit(limit)).all())


def add_hits(session: Session, hits: dict[str, int]) -> None:
    # in id order: concurrent uploads lock the same rule rows in the same order (no deadlock)
    for rule_id, count in sorted(hits.items()):
        if count:
            session.execute(update(RuleRow).where(RuleRow.id == rule_id).values(hits=RuleRow.hits + count))


class RuleStore:
    """The database as a rule source for the Rulebook."""

    def __init__(self, db: Database):
        self.db = db

    def version(self) -> int:
        with self.db.session() as session:
            return rules_version(session)

    def active_rules(self) -> tuple[list[FilterRule], list[DiagnosisRule]]:
        with self.db.session() as session:
            return self.rows_to_rules(active_rows(session))

    @staticmethod
    def rows_to_rules(rows: Iterable[RuleRow]) -> tuple[list[FilterRule], list[DiagnosisRule]]:
        rows = list(rows)
        filters = [row_to_filter_rule(r) for r in rows if r.kind == RuleKind.FILTER]
        diagnosis = [row_to_diagnosis_rule(r) for r in rows if r.kind == RuleKind.DIAGNOSIS]
        return filters, diagnosis


def active_rows(session: Session) -> list[RuleRow]:
    return list(session.scalars(select(RuleRow).where(RuleRow.status == RuleStatus.ACTIVE)
                                .order_by(RuleRow.created_at, RuleRow.id)).all())


# -- jobs ----------------------------------------------------------------------------------
def new_job_id() -> str:
    return uuid.uuid4().hex


def create_job(session: Session, *, name: str, family: str, framework: str | None = None,
               tags: Sequence[str] = (), live: bool = False, meta: dict[str, Any] | None = None,
               idempotency_key: str | None = None) -> Job:
    job = Job(id=new_job_id(), name=name, family=family, framework=framework, tags=list(tags),
              live=live, meta=meta or {}, idempotency_key=idempotency_key)
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def job_by_idempotency_key(session: Session, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.idempotency_key == key))


def find_jobs(session: Session, *, name: str | None = None, family: str | None = None,
              status: str | None = None, external_id: str | None = None, limit: int = 50,
              offset: int = 0) -> list[Job]:
    query = select(Job)
    if name:
        query = query.where(Job.name == name)
    if external_id:
        query = query.where(Job.external_id == external_id)
    if family:
        query = query.where(Job.family == family)
    if status:
        query = query.where(Job.status == status)
    return list(session.scalars(query.order_by(Job.created_at.desc()).limit(limit).offset(offset)).all())


def earlier_attempts(session: Session, external_id: str, *, but: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The diagnoses of a job's finished attempts (same external_id), newest first."""
    query = select(Job.diagnosis).where(Job.external_id == external_id, Job.finished_at.is_not(None),
                                        Job.diagnosis.is_not(None))
    if but:
        query = query.where(Job.id != but)
    return [d for d in session.scalars(query.order_by(Job.finished_at.desc(), Job.created_at.desc()).limit(limit))]


def save_diagnosis(session: Session, job: Job, diagnosis: dict[str, Any], *, finished: bool) -> None:
    job.diagnosis = diagnosis
    job.status = diagnosis["status"]
    root = diagnosis.get("root_cause")
    job.reason = root["reason"] if root else None
    if not job.live:  # an upload's lines are the pipeline's; a live job counts what its appends complete
        comp = diagnosis.get("compression") or {}
        job.lines_received = max(job.lines_received, int(comp.get("lines_in") or 0))
    if finished and job.finished_at is None:
        job.finished_at = utcnow()


def save_kept_lines(session: Session, job_id: str, lines: Iterable[KeptLine], *, limit: int = KEPT_LINES_PER_JOB) -> int:
    stored = session.scalar(select(func.count()).select_from(KeptLineRow).where(KeptLineRow.job_id == job_id)) or 0
    rows = []
    for line in lines:
        if stored + len(rows) >= limit:
            break
        rows.append({"job_id": job_id, "source": line.source, "line_number": line.line_number,
                     "text": line.text, "error_like": line.error_like})
    if rows:
        session.execute(KeptLineRow.__table__.insert(), rows)
    return len(rows)


def kept_lines(session: Session, job_id: str, *, limit: int = KEPT_LINES_PER_JOB) -> list[KeptLine]:
    rows = session.scalars(select(KeptLineRow).where(KeptLineRow.job_id == job_id)
                           .order_by(KeptLineRow.id).limit(limit)).all()
    return [KeptLine(r.line_number, r.text, r.error_like, r.source) for r in rows]


def touch(job: Job, *, at: datetime | None = None) -> None:
    job.last_output_at = at or utcnow()
