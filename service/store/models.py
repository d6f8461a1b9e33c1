"""Database tables (SQLAlchemy 2). SQLite is the default; PostgreSQL for deployments."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.types import TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator):
    """A time stored in UTC and read back as an aware UTC datetime on every backend: SQLite
    hands back naive values and PostgreSQL converts to the session's time zone, so the API's
    times would otherwise come with an offset on one database and without on the other."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, _dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, _dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(512), default="", index=True)
    family: Mapped[str] = mapped_column(String(512), default="", index=True)
    framework: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tags: Mapped[list[Any]] = mapped_column(default=list)
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)
    live: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_output_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    lines_received: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_received: Mapped[int] = mapped_column(BigInteger, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    diagnosis: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True, unique=True, index=True)
    """The client's `Idempotency-Key` of the POST /diagnose that stored this job: a retry
    (after a timeout, or sent to another replica) finds the stored job instead of adding one."""
    external_id: Mapped[str | None] = mapped_column(String(256), nullable=True, index=True)
    """The scheduler's id of a live job (Slurm job id, Kubernetes Job uid): sidecars on
    several nodes of one job find the same Faultline job by it."""


class KeptLineRow(Base):
    """The compressed log of a job: the lines the filter kept (redacted), bounded per job."""

    __tablename__ = "kept_lines"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(String(512), default="")
    line_number: Mapped[int] = mapped_column(BigInteger)
    text: Mapped[str] = mapped_column(Text)
    error_like: Mapped[bool] = mapped_column(Boolean, default=False)


class Chunk(Base):
    """Chunks appended to a live job: the ledger that makes appends idempotent. Only the
    last chunks of each file are kept (a resend can only be of those); JobSource holds
    where the next one must start."""

    __tablename__ = "job_chunks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    source: Mapped[str] = mapped_column(String(512), primary_key=True)
    file_id: Mapped[str] = mapped_column(String(128), primary_key=True, default="")
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    length: Mapped[int] = mapped_column(BigInteger)
    """File bytes the chunk covers (the body may be shorter: cut long lines)."""
    lines: Mapped[int] = mapped_column(Integer)
    checksum: Mapped[str] = mapped_column(String(64), default="")
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RuleRow(Base):
    """A rule that is not built in: learned by an agent, imported, or edited by a person."""

    __tablename__ = "rules"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)          # filter | diagnosis
    status: Mapped[str] = mapped_column(String(16), index=True)        # pending | active | rejected | disabled
    scope: Mapped[str] = mapped_column(String(256), default="global", index=True)
    source: Mapped[str] = mapped_column(String(64), default="log_agent", index=True)
    pattern: Mapped[str] = mapped_column(Text)
    """Filter: the pattern. Diagnosis: patterns joined as a JSON list in `patterns`."""
    patterns: Mapped[list[Any]] = mapped_column(default=list)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tier: Mapped[str | None] = mapped_column(String(16), nullable=True)
    origin: Mapped[str | None] = mapped_column(String(16), nullable=True)
    action: Mapped[str | None] = mapped_column(String(32), nullable=True)
    mitigation: Mapped[str] = mapped_column(Text, default="")
    description: Mapped[str] = mapped_column(Text, default="")
    provenance: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Who proposed it (backend, model), votes, evidence lines, validation results."""
    hits: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int] = mapped_column(Integer, default=1)
    review_note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class RuleVersion(Base):
    __tablename__ = "rule_versions"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    rule_id: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    changed_by: Mapped[str] = mapped_column(String(128), default="")
    change: Mapped[str] = mapped_column(String(32))
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256), default="")
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Incident(Base):
    """The Failure Agent's knowledge base: past failures, how they were diagnosed and fixed."""

    __tablename__ = "incidents"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(String(64), index=True)
    category: Mapped[str | None] = mapped_column(String(32), nullable=True)
    origin: Mapped[str] = mapped_column(String(16))
    tier: Mapped[str] = mapped_column(String(16), default="cause")
    """How strongly such a line explains a failure (rules/model.py Tier)."""
    mitigation: Mapped[str] = mapped_column(Text, default="")
    confirmed_by: Mapped[str] = mapped_column(String(64), default="")
    """`taxonomy`, `description`, `builtin_rule`, `rule:<id>`, `admin`, `label`."""
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """float32 vector of the text, so a replica rebuilds its index without re-embedding."""
    embedding_model: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Counter(Base):
    """Named counters (the rule-set version that replicas watch)."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


Index("ix_kept_lines_job_line", KeptLineRow.job_id, KeptLineRow.source, KeptLineRow.line_number)
# one unfinished live job per scheduler id; a requeued Slurm job keeps its id and gets a new job
Index("ux_jobs_open_external_id", Job.external_id, unique=True,
      sqlite_where=Job.finished_at.is_(None), postgresql_where=Job.finished_at.is_(None))


class JobState(Base):
    """A live job's processing state between appends (see JobRun.snapshot), versioned so a
    replica reuses its cached copy only while nobody else has moved it on."""

    __tablename__ = "job_states"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class JobSource(Base):
    """One file of a live job as the ledger sees it: where the next chunk must start, and
    what was received so far (lines, bytes, a running CRC-32 to check exactly-once delivery).
    `source` is the name the job's diagnosis uses (rotated files keep it); `file_id` tells the
    physical files of one source apart (the sidecar's fingerprint)."""

    __tablename__ = "job_sources"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    source: Mapped[str] = mapped_column(String(512), primary_key=True)
    file_id: Mapped[str] = mapped_column(String(128), primary_key=True, default="")
    first_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    next_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    lines: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    crc32: Mapped[int] = mapped_column(BigInteger, default=0)
    chunks: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class Notification(Base):
    """The webhook outbox: written in the transaction that changes a job, delivered (and
    retried) by whichever replica claims it first."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    """`pending`, `delivered` or `failed` (gave up after the last attempt)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str] = mapped_column(Text, default="")
