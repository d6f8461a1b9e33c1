"""Batches from Fluent Bit and Vector into the live-job ledger, exactly once.

A sidecar sends each file's chunks in order and resumes where the ledger says; a shipper
does neither: it retries a request whose answer it missed (the same records again), may send
a later batch while an earlier one waits for its retry (Fluent Bit flushes chunks on their
own; Vector sends requests concurrently), restarts a file at offset 0 when it is rotated,
and drops a batch for good on a 4xx answer (both treat 429 and 5xx as "retry later").

So a batch is placed by the lines' offsets rather than refused:
- lines the ledger already holds (a retry, a replay in other batches) are skipped; the rest
  is appended where the ledger ends;
- a batch that starts past the ledger's end waits (503, the shipper retries) for the batch in
  between, up to GAP_WAIT_S since the file last moved; after that those bytes count as lost
  and the batch is taken;
- a batch that starts at offset 0 of a file the ledger has seen past 0, and is not a retry of
  the file's first chunk, is the file after a rotation: a new physical file of that source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from service.errors import Busy, Conflict
from service.ingest.records import Batch
from service.live import ledger
from service.live.ledger import ChunkRef, checksum
from service.live.runs import LiveJobs

GAP_SLACK = 64
"""Bytes a shipper reads without making a record of them: the CR of a CRLF line end, blank
lines (Fluent Bit's skip_empty_lines). A batch starting this close to the ledger's end follows on."""
GAP_WAIT_S = 30.0
"""How long a batch that skips ahead waits for the batch before it (a retry comes within
seconds; a batch the shipper dropped never does)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """What to do with a batch: append `lines` as `chunk`, skip it (`chunk` None), or wait."""

    chunk: ChunkRef | None = None
    lines: Batch | None = None
    wait_for: int | None = None
    """The offset the ledger waits for: answer 503, the shipper sends the batch again later."""


@dataclass(frozen=True, slots=True)
class FileState:
    """What the ledger holds of the file a shipper now reads under one name."""

    file_id: str
    next_offset: int | None
    """Where the ledger ends; None before the file's first batch."""
    idle_s: float
    """Seconds since the ledger last moved for this file."""
    generation: int


def file_id(generation: int) -> str:
    return f"shipped:{generation}"


def _generation(shipped_file_id: str) -> int:
    return int(shipped_file_id.split(":", 1)[1])


def place(batch: Batch, state: FileState, stored: tuple[int, str] | None) -> tuple[Placement, str]:
    """Where `batch` goes, and in which physical file (a rotation starts the next one).
    `stored`: (length, checksum) of the chunk the ledger remembers at the batch's offset."""
    whole = ChunkRef(batch.source, state.file_id, batch.offset, batch.end, checksum(batch.body))
    nxt = state.next_offset
    if nxt is None:
        return Placement(whole, batch), state.file_id
    if stored == (whole.length, whole.checksum):
        return Placement(), state.file_id  # a retry of a batch the ledger took
    if batch.offset == 0 and nxt > 0:
        rotated = file_id(state.generation + 1)
        return Placement(ChunkRef(batch.source, rotated, 0, batch.end, whole.checksum), batch), rotated
    if batch.offset > nxt + GAP_SLACK and state.idle_s < GAP_WAIT_S:
        return Placement(wait_for=nxt), state.file_id
    rest = batch.since(nxt)
    if rest is None:
        return Placement(), state.file_id  # every line already held: a replay in other batches
    # appended where the ledger ends, so it follows on (a CR or a lost batch in between is
    # covered by the chunk, not a gap the ledger would refuse)
    return Placement(ChunkRef(batch.source, state.file_id, nxt, rest.end, checksum(rest.body)), rest), state.file_id


def file_state(session: Session, job_id: str, source: str) -> FileState:
    """The ledger's newest physical file of `source` among the shipped ones."""
    rows = [row for row in ledger.files_of(session, job_id, source) if row.file_id.startswith("shipped:")]
    if not rows:
        return FileState(file_id(0), None, 0.0, 0)
    newest = max(rows, key=lambda row: _generation(row.file_id))
    return FileState(newest.file_id, newest.next_offset, (datetime.now(UTC) - newest.updated_at).total_seconds(),
                     _generation(newest.file_id))


def deliver(live: LiveJobs, job_id: str, batch: Batch) -> dict:
    """Place one batch and append it; Busy (503, retried by the shipper) while it waits for an
    earlier batch or races another request for the same file."""
    with live.ctx.db.session() as session:
        state = file_state(session, job_id, batch.source)
        stored = ledger.stored_chunk(session, job_id, batch.source, state.file_id, batch.offset)
    placement, physical = place(batch, state, stored)
    if placement.wait_for is not None:
        raise Busy(f"{batch.source!r}: waiting for the records from byte {placement.wait_for} (this batch starts at "
                   f"{batch.offset}); after {GAP_WAIT_S:.0f} s without them they count as lost")
    if placement.chunk is None:
        return {"source": batch.source, "file": physical, "lines": 0, "duplicate": True}
    try:
        ack = live.append(job_id, placement.chunk, placement.lines.body)
    except Conflict as exc:
        if exc.extra.get("reason") not in ("gap", "overlap"):
            raise
        # another request moved this file on between the read above and the append
        raise Busy(f"{batch.source!r}: {exc}; retry") from None
    return {"source": batch.source, "file": physical, "lines": ack["lines"], "duplicate": ack["duplicate"]}
