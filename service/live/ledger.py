"""The chunk ledger of live jobs: appends are idempotent by (source, file, offset).

A sidecar sends each file as consecutive chunks of whole lines. The chunk that starts where
the file's last one ended is new; a resend of a chunk already acknowledged (same offset,
length and checksum) is acknowledged again and counted once; anything else is a gap or an
overlap, refused with the offset the ledger expects. The sender seeks there and goes on:
after a crash of either side (acknowledged but not yet checkpointed, checkpointed but the
server's database restored), this is how the two agree without losing or doubling a line.

The first chunk of a file may start anywhere (`--from end` starts mid-file).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.models import Chunk, JobSource, utcnow

KEEP_CHUNKS = 16
"""Chunks remembered per file: a sender only ever resends the few it had in flight."""


class Verdict(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    GAP = "gap"
    OVERLAP = "overlap"


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where a chunk comes from: the bytes [offset, end) of one file of one source."""

    source: str
    file_id: str
    offset: int
    end: int
    checksum: str

    @property
    def length(self) -> int:
        return self.end - self.offset


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    expected_offset: int | None = None


def checksum(body: bytes) -> str:
    return f"crc32:{zlib.crc32(body):08x}"


def decide(chunk: ChunkRef, next_offset: int | None, stored: tuple[int, str] | None) -> Decision:
    """What to do with a chunk.

    Args:
        chunk: the chunk as sent.
        next_offset: where the file's next chunk must start; None before its first chunk.
        stored: (length, checksum) of the chunk already stored at the same offset, if any.
    """
    if next_offset is None or chunk.offset == next_offset:
        return Decision(Verdict.NEW, chunk.end)
    if chunk.offset < next_offset and stored == (chunk.length, chunk.checksum):
        return Decision(Verdict.DUPLICATE, next_offset)
    return Decision(Verdict.GAP if chunk.offset > next_offset else Verdict.OVERLAP, next_offset)


def look_up(session: Session, job_id: str, chunk: ChunkRef) -> tuple[JobSource | None, tuple[int, str] | None]:
    """The file's ledger row and, for a chunk that starts before its end, the stored chunk
    at that offset."""
    row = session.get(JobSource, (job_id, chunk.source, chunk.file_id))
    stored = None
    if row is not None and chunk.offset < row.next_offset:
        stored = stored_chunk(session, job_id, chunk.source, chunk.file_id, chunk.offset)
    return row, stored


def files_of(session: Session, job_id: str, source: str) -> list[JobSource]:
    """The physical files of one source that the ledger holds."""
    return list(session.scalars(select(JobSource).where(JobSource.job_id == job_id, JobSource.source == source)))


def stored_chunk(session: Session, job_id: str, source: str, file_id: str, offset: int) -> tuple[int, str] | None:
    """(length, checksum) of the chunk remembered at `offset` of the file, if any."""
    found = session.get(Chunk, (job_id, source, file_id, offset))
    return (found.length, found.checksum) if found is not None else None


def record(session: Session, job_id: str, chunk: ChunkRef, *, lines: int, body: bytes) -> JobSource:
    """Write an accepted chunk: its ledger entry and the file's running totals."""
    row = session.get(JobSource, (job_id, chunk.source, chunk.file_id))
    if row is None:
        row = JobSource(job_id=job_id, source=chunk.source, file_id=chunk.file_id, first_offset=chunk.offset,
                        next_offset=chunk.offset, lines=0, bytes=0, crc32=0, chunks=0)
        session.add(row)
    row.next_offset = chunk.end
    row.lines += lines
    row.bytes += len(body)
    row.crc32 = zlib.crc32(body, row.crc32)
    row.chunks += 1
    row.updated_at = utcnow()
    session.add(Chunk(job_id=job_id, source=chunk.source, file_id=chunk.file_id, offset=chunk.offset,
                      length=chunk.length, lines=lines, checksum=chunk.checksum))
    if row.chunks % KEEP_CHUNKS == 0:
        _prune(session, job_id, chunk)
    return row


def _prune(session: Session, job_id: str, chunk: ChunkRef) -> None:
    same_file = (Chunk.job_id == job_id, Chunk.source == chunk.source, Chunk.file_id == chunk.file_id)
    session.flush()
    cutoff = session.scalar(select(Chunk.offset).where(*same_file).order_by(Chunk.offset.desc())
                            .limit(1).offset(KEEP_CHUNKS))
    if cutoff is not None:
        session.execute(delete(Chunk).where(*same_file, Chunk.offset <= cutoff))


def sources(session: Session, job_id: str) -> list[dict]:
    rows = session.scalars(select(JobSource).where(JobSource.job_id == job_id)
                           .order_by(JobSource.source, JobSource.first_offset, JobSource.file_id)).all()
    return [{"source": r.source, "file": r.file_id, "first_offset": r.first_offset, "next_offset": r.next_offset,
             "lines": r.lines, "bytes": r.bytes, "crc32": f"{r.crc32:08x}", "chunks": r.chunks} for r in rows]
