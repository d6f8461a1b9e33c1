"""Live jobs: created by a sidecar, fed chunk by chunk, diagnosed while they run.

An append restores the job's processing state (JobRun.snapshot) - from this replica's
cache while no other replica has moved the job on, else from the database - feeds the
chunk, and writes the new state back with a version check: the write succeeds only if the
state it started from is still the latest, so two appends of one job that race (on one
replica or on two) never both count; the loser starts again from the winner's state. The
CPU work runs outside any database transaction: SQLite's single writer is held only to write.

Stalls are judged by the clock (rules/hang.py): on every append, on GET /jobs/{id}, and by a
periodic sweep in each replica. Marking a job stalled is a conditional update, so of several
replicas sweeping at once one wins and one notification goes out.
"""

from __future__ import annotations

import pickle
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from rules.attempts import apply_budget
from rules.hang import Silence, report_periods, silence
from rules.taxonomy import Action, JobStatus
from rules.verdict import from_hang
from service.live import ledger
from service.store import jobs as store
from service.context import Context
from service.errors import Busy, Conflict, NotFound
from service.ingest.lines import whole_lines
from service.live.ledger import ChunkRef, Verdict
from service.store.models import Job, JobState, utcnow
from service.live.notify import Outbox, event_key
from rules.job import JobMeta, JobRun

MAX_ATTEMPTS = 8
LOCK_STRIPES = 64
RECENT_PERIODS = 32
STATE_FORMAT = 1
MAX_READ_AGE_S = 7 * 24 * 3600.0


class _Raced(Exception):
    """Another append moved the job on first."""


def _ts(value: datetime | None) -> float | None:
    """Epoch seconds (the store reads times back as aware UTC datetimes)."""
    if value is None:
        return None
    return value.timestamp()


def _dt(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class RunCache:
    """This replica's JobRuns by job id, each with the state version it stands for (LRU)."""

    def __init__(self, size: int):
        self.size = size
        self._runs: OrderedDict[str, tuple[int, JobRun]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str, version: int) -> JobRun | None:
        with self._lock:
            entry = self._runs.get(job_id)
            if entry is None or entry[0] != version:
                return None
            self._runs.move_to_end(job_id)
            return entry[1]

    def put(self, job_id: str, version: int, run: JobRun) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._runs[job_id] = (version, run)
            self._runs.move_to_end(job_id)
            while len(self._runs) > self.size:
                self._runs.popitem(last=False)

    def evict(self, job_id: str) -> None:
        with self._lock:
            self._runs.pop(job_id, None)

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()


class LiveJobs:
    def __init__(self, ctx: Context, outbox: Outbox, *, clock: Callable[[], float] = time.time):
        self.ctx = ctx
        self.settings = ctx.settings
        self.outbox = outbox
        self.clock = clock
        self.cache = RunCache(ctx.settings.live_cached_jobs)
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def _lock(self, job_id: str) -> threading.Lock:
        """Appends of one job on this replica wait for each other instead of racing."""
        return self._locks[zlib.crc32(job_id.encode()) % LOCK_STRIPES]

    # -- state ---------------------------------------------------------------------------------
    def pack(self, run: JobRun) -> bytes:
        agent = run.log_agent.state() if run.log_agent is not None and hasattr(run.log_agent, "state") else None
        return pickle.dumps({"format": STATE_FORMAT, "run": run.snapshot(), "agent": agent},
                            protocol=pickle.HIGHEST_PROTOCOL)

    def unpack(self, blob: bytes) -> JobRun:
        data = pickle.loads(blob)  # noqa: S301 - our own bytes in our own database (JobRun.snapshot)
        if data.get("format") != STATE_FORMAT:
            raise ValueError("live job state of another format version")
        failure_agent = self.ctx.failure_agent if self.settings.failure_agent else None
        return JobRun.restore(data["run"], self.ctx.rulebook, log_agent=self.ctx.resume_log_agent(data["agent"]),
                              failure_agent=failure_agent)

    def _run(self, job_id: str, version: int) -> JobRun:
        run = self.cache.get(job_id, version)
        if run is not None:
            return run
        with self.ctx.db.session() as session:
            row = session.execute(select(JobState.version, JobState.blob).where(JobState.job_id == job_id)).first()
        if row is None or row.version != version:
            raise _Raced
        return self.unpack(row.blob)

    def _save_state(self, session: Session, job_id: str, version: int, run: JobRun) -> None:
        """Compare-and-set; the first statement of the write, so SQLite takes its write lock
        at once instead of failing to upgrade a read transaction."""
        done = session.execute(update(JobState).where(JobState.job_id == job_id, JobState.version == version)
                               .values(version=version + 1, blob=self.pack(run), updated_at=utcnow())).rowcount
        if done != 1:
            raise _Raced

    # -- create --------------------------------------------------------------------------------
    def create(self, *, name: str, framework: str | None, tags: tuple[str, ...],
               external_id: str | None) -> tuple[Job, bool]:
        """A new live job, or (created False) the open job with this external id."""
        if external_id:
            existing = self._open_job(external_id)
            if existing is not None:
                return existing, False
        meta = JobMeta(name=name, framework=framework, tags=tags)
        run = self.ctx.new_run(meta)
        try:
            with self.ctx.db.session() as session:
                job = store.create_job(session, name=name, family=meta.family, framework=framework, tags=tags,
                                       live=True, meta={})
                job.external_id = external_id or None
                job.diagnosis = run.current().to_dict()
                session.add(JobState(job_id=job.id, version=0, blob=self.pack(run)))
            return job, True
        except IntegrityError:
            existing = self._open_job(external_id) if external_id else None
            if existing is None:
                raise
            return existing, False  # a sidecar on another node created it a moment ago

    def _open_job(self, external_id: str) -> Job | None:
        with self.ctx.db.session() as session:
            return session.scalars(select(Job).where(Job.external_id == external_id,
                                                     Job.finished_at.is_(None))).first()

    # -- append --------------------------------------------------------------------------------
    def append(self, job_id: str, chunk: ChunkRef, body: bytes, *, read_age_s: float = 0.0) -> dict[str, Any]:
        """Feed one chunk; idempotent by (source, file, offset). Raises Conflict with the
        expected offset on a gap or an overlap, NotFound, or Busy when racing never ends."""
        buffer, lines = whole_lines(body)
        observed = self.clock() - min(max(read_age_s, 0.0), MAX_READ_AGE_S)
        with self._lock(job_id):
            for attempt in self._races(job_id, counted=True):
                with attempt:
                    return self._append_once(job_id, chunk, body, buffer, lines, observed)
        raise AssertionError("unreachable: _races returns or raises")

    def _races(self, job_id: str, *, counted: bool) -> Retrying:
        """Attempts at a change of the job's state that another append may beat (its state
        version moved on, or it inserted the same row first): each lost race starts again
        from the winner's state after a random pause that grows (full jitter), and after
        MAX_ATTEMPTS the client is told to retry (503)."""

        def lost(_state: RetryCallState) -> None:
            self.cache.evict(job_id)
            if counted:
                self.ctx.metrics.live_chunks.labels("raced").inc()

        def give_up(state: RetryCallState) -> None:
            lost(state)
            raise Busy(f"job {job_id} is being appended to from elsewhere; retry")

        return Retrying(retry=retry_if_exception_type((_Raced, IntegrityError)), stop=stop_after_attempt(MAX_ATTEMPTS),
                        wait=wait_random_exponential(multiplier=0.02, max=0.5), before_sleep=lost,
                        retry_error_callback=give_up)

    def _append_once(self, job_id: str, chunk: ChunkRef, body: bytes, buffer: bytes, lines: int,
                     observed: float) -> dict[str, Any]:
        with self.ctx.db.session() as session:
            job = self._live_job(session, job_id)
            # the version first: if the ledger moves after this read, so does the version
            version = session.scalar(select(JobState.version).where(JobState.job_id == job_id))
            row, stored = ledger.look_up(session, job_id, chunk)
            decision = ledger.decide(chunk, row.next_offset if row else None, stored)
            total = job.lines_received
        if decision.verdict is not Verdict.NEW:
            self.ctx.metrics.live_chunks.labels(decision.verdict.value).inc()
            if decision.verdict is Verdict.DUPLICATE:
                return self._ack(job_id, chunk, decision.expected_offset, 0, total, duplicate=True)
            raise Conflict(
                f"{decision.verdict.value}: chunk of {chunk.source!r} starts at byte {chunk.offset}, "
                f"the job expects byte {decision.expected_offset}",
                reason=decision.verdict.value, expected_offset=decision.expected_offset,
                source=chunk.source, file=chunk.file_id)
        if self.ctx.rulebook.refresh():
            self.cache.clear()  # rules changed: cached programs are stale
        run = self._run(job_id, version)
        try:
            kept = run.feed(chunk.source, buffer, raw_bytes=len(body)) if buffer else []
            diagnosis = run.current()
            with self.ctx.db.session() as session:
                self._save_state(session, job_id, version, run)
                job = session.get(Job, job_id)
                ledger.record(session, job_id, chunk, lines=lines, body=body)
                self._note_output(job, run, chunk.source, lines, len(body), observed)
                notified = self._settle(session, job, diagnosis.to_dict())
                if kept:
                    store.save_kept_lines(session, job_id, kept)
                total = job.lines_received
        except BaseException:
            self.cache.evict(job_id)  # fed but not saved: the cached run is ahead of the database
            raise
        self.cache.put(job_id, version + 1, run)
        if notified:
            self.outbox.poke()
        self.ctx.metrics.live_chunks.labels("new").inc()
        self.ctx.metrics.lines_ingested.labels("live").inc(lines)
        return self._ack(job_id, chunk, chunk.end, lines, total, duplicate=False)

    @staticmethod
    def _any_live_job(session: Session, job_id: str) -> Job:
        """The live job, finished or not."""
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        if not job.live:
            raise Conflict(f"job {job_id} was not created as a live job (POST /jobs)", reason="not_live")
        return job

    @classmethod
    def _live_job(cls, session: Session, job_id: str) -> Job:
        """The live job, which must still be running."""
        job = cls._any_live_job(session, job_id)
        if job.finished_at is not None:
            raise Conflict(f"job {job_id} has finished; it takes no more lines", reason="finished")
        return job

    @staticmethod
    def _ack(job_id: str, chunk: ChunkRef, next_offset: int | None, lines: int, total: int, *,
             duplicate: bool) -> dict[str, Any]:
        return {"job_id": job_id, "source": chunk.source, "file": chunk.file_id, "offset": chunk.offset,
                "next_offset": next_offset, "lines": lines, "duplicate": duplicate, "lines_received": total}

    def _note_output(self, job: Job, run: JobRun, source: str, lines: int, size: int, observed: float) -> None:
        """Counters, and what the stall check needs: when output and progress last came,
        how long the job's progress reports take, the longest pause it survived."""
        job.lines_received += lines
        job.bytes_received += size
        # output is output even when it ends in a partial line (counted once its end comes)
        if size and (job.last_output_at is None or observed > _ts(job.last_output_at)):
            job.last_output_at = _dt(observed)
        live = dict((job.meta or {}).get("live") or {})
        primary = run.primary_progress()
        if run.sources.get(source) is not None and size:
            live["last_line"] = self._last_line(run, source)
        if primary is not None:
            step = primary.progress.last_step
            points = primary.progress.points_seen
            if step is not None and (live.get("last_step") is None or step > live["last_step"]):
                before = _ts(job.last_progress_at)
                if before is not None and live.get("last_step") is not None and observed > before:
                    gap = observed - before
                    live["longest_gap_s"] = max(float(live.get("longest_gap_s") or 0.0), gap)
                    reports = max(1, points - int(live.get("points") or 0))
                    live["arrival_s"] = [*(live.get("arrival_s") or []), gap / reports][-RECENT_PERIODS:]
                job.last_progress_at = _dt(max(observed, before or observed))
                live["last_step"] = step
                if primary.progress.last_line is not None:
                    number, text = primary.progress.last_line
                    live["last_progress_line"] = {"line": primary.redactor.redact(text), "line_number": number,
                                                  "file": primary.name}
            live["points"] = points
            periods = report_periods(primary.progress.recent("step", 4 * RECENT_PERIODS),
                                     primary.progress.recent("step_time_s", 4 * RECENT_PERIODS))
            live["report_s"] = periods[-RECENT_PERIODS:] or live.get("arrival_s") or []
        job.meta = {**(job.meta or {}), "live": live}

    @staticmethod
    def _last_line(run: JobRun, source: str) -> dict[str, Any]:
        src = run.sources[source]
        text = src.tail[-1] if src.tail else ""
        return {"line": src.redactor.redact(text), "line_number": src.stream.lines_in, "file": source}

    def _settle(self, session: Session, job: Job, diagnosis: dict[str, Any], *, final: bool = False) -> bool:
        """Store the diagnosis (a stall if the clock says so) and queue a notification when
        it calls for action and says something new. True when one was queued."""
        if not final and diagnosis["status"] == JobStatus.RUNNING.value and diagnosis.get("root_cause") is None:
            quiet = self._silence(job, self.clock())
            if quiet is not None:
                diagnosis = self._stalled(job, diagnosis, quiet)
        store.save_diagnosis(session, job, diagnosis, finished=final)
        key = event_key(diagnosis)
        meta = dict(job.meta or {})
        if key[0] is None:
            if meta.pop("notified", None) is not None:
                job.meta = meta  # the alarm is over: the next one is news again
            return False
        if key == meta.get("notified") and not final:
            return False
        job.meta = {**meta, "notified": key}
        return self.outbox.enqueue(session, job, diagnosis, final=final)

    # -- stalls --------------------------------------------------------------------------------
    def _silence(self, job: Job, now: float) -> Silence | None:
        live = (job.meta or {}).get("live") or {}
        return silence(now=now, started_at=_ts(job.created_at) or now, last_output_at=_ts(job.last_output_at),
                       last_progress_at=_ts(job.last_progress_at), floor_s=self.settings.hang_floor_s,
                       factor=self.settings.hang_step_factor, step_seconds=live.get("report_s") or [],
                       longest_gap_s=float(live.get("longest_gap_s") or 0.0))

    def _stalled(self, job: Job, diagnosis: dict[str, Any], quiet: Silence) -> dict[str, Any]:
        live = (job.meta or {}).get("live") or {}
        where = live.get("last_progress_line") if quiet.since == "progress" else live.get("last_line")
        where = where or {"line": "", "line_number": 0, "file": ""}
        view, mitigation = from_hang(where["line"], where["line_number"], where["file"], quiet.seconds,
                                     since=quiet.since)
        return {**diagnosis, "status": JobStatus.STALLED.value, "root_cause": asdict(view),
                "action": Action.RESTART.value, "mitigation": mitigation,
                "stall": {"silent_s": round(quiet.seconds, 3), "threshold_s": round(quiet.threshold, 3),
                          "since": quiet.since}}

    def check_stall(self, job_id: str) -> bool:
        """Mark the job stalled if it has been silent past its threshold; True if this call did."""
        with self.ctx.db.session() as session:
            job = session.get(Job, job_id)
            if job is None or not job.live or job.finished_at is not None or job.status != JobStatus.RUNNING.value:
                return False
            if (job.diagnosis or {}).get("root_cause") is not None:
                return False
            quiet = self._silence(job, self.clock())
            if quiet is None:
                return False
            diagnosis = self._stalled(job, job.diagnosis or {}, quiet)
            meta = {**(job.meta or {}), "notified": event_key(diagnosis)}
            queued = False
            # only if nothing moved since the read: an append or another replica wins
            won = session.execute(
                update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING.value, Job.finished_at.is_(None),
                                  Job.lines_received == job.lines_received)
                .values(status=JobStatus.STALLED.value, reason="hang", diagnosis=diagnosis, meta=meta,
                        updated_at=utcnow())).rowcount == 1
            if won:
                job.status, job.diagnosis = JobStatus.STALLED.value, diagnosis
                queued = self.outbox.enqueue(session, job, diagnosis)
        if won:
            self.ctx.metrics.stalls.labels(quiet.since).inc()
            if queued:
                self.outbox.poke()
        return won

    def sweep(self) -> int:
        """Check the live jobs silent for at least the floor (none can be stalled sooner)."""
        cutoff = _dt(self.clock() - self.settings.hang_floor_s)
        with self.ctx.db.session() as session:
            ids = session.scalars(select(Job.id).where(
                Job.live.is_(True), Job.finished_at.is_(None), Job.status == JobStatus.RUNNING.value,
                or_(Job.last_progress_at < cutoff,
                    and_(Job.last_progress_at.is_(None), func.coalesce(Job.last_output_at, Job.created_at) < cutoff)),
            ).limit(1000)).all()
        return sum(self.check_stall(job_id) for job_id in ids)

    # -- finish --------------------------------------------------------------------------------
    def finish(self, job_id: str, exit_code: int | None) -> Job:
        """The final diagnosis (agents included) and the exit status; repeating it is harmless."""
        with self._lock(job_id):
            for attempt in self._races(job_id, counted=False):
                with attempt:
                    return self._finish_once(job_id, exit_code)
        raise AssertionError("unreachable: _races returns or raises")

    def _finish_once(self, job_id: str, exit_code: int | None) -> Job:
        with self.ctx.db.session() as session:
            job = self._any_live_job(session, job_id)
            if job.finished_at is not None:
                if exit_code is not None and job.exit_code is not None and exit_code != job.exit_code:
                    raise Conflict(f"job {job_id} already finished with exit code {job.exit_code}",
                                   reason="finished", exit_code=job.exit_code)
                return job
            version = session.scalar(select(JobState.version).where(JobState.job_id == job_id))
            stored = job.diagnosis or {}
        self.ctx.rulebook.refresh()
        run = self._run(job_id, version)
        self.cache.evict(job_id)  # finish() changes the run; it is never appended to again
        result = run.finish()
        diagnosis = with_exit_code(carry_stall(result.to_dict(), stored), exit_code)
        with self.ctx.db.session() as session:
            self._save_state(session, job_id, version, run)
            job = session.get(Job, job_id)
            if job.external_id:
                diagnosis = apply_budget(diagnosis, store.earlier_attempts(session, job.external_id, but=job.id),
                                         self.ctx.settings.restart_budget)
            job.exit_code = exit_code
            curve = run.loss_curve()
            if curve:
                job.meta = {**(job.meta or {}), "loss_curve": curve}
            notified = self._settle(session, job, diagnosis, final=True)
        if notified:
            self.outbox.poke()
        result.status = diagnosis["status"]
        self.ctx.after_run(run, result, entry="live", job_id=job_id)
        return job

    def sources(self, job_id: str) -> list[dict[str, Any]]:
        with self.ctx.db.session() as session:
            if session.get(Job, job_id) is None:
                raise NotFound(f"no job {job_id!r}")
            return ledger.sources(session, job_id)


def carry_stall(final: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """The clock's verdict survives the end: a job that stalled and was then killed died of
    the hang, which the log alone cannot show."""
    if (stored.get("status") != JobStatus.STALLED.value or final.get("root_cause") is not None
            or final["status"] == JobStatus.FAILED.value):
        return final
    return {**final, "status": JobStatus.STALLED.value, "root_cause": stored.get("root_cause"),
            "action": stored.get("action"), "mitigation": stored.get("mitigation"), "stall": stored.get("stall")}


def with_exit_code(diagnosis: dict[str, Any], exit_code: int | None) -> dict[str, Any]:
    """The log's verdict, completed by how the process ended. An exit code only ever makes
    a job failed: a clean exit does not clear an error the log shows."""
    out = {**diagnosis, "exit_code": exit_code}
    if exit_code is None:
        return out
    root = out.get("root_cause")
    failed = out["status"] == JobStatus.FAILED.value
    if exit_code == 0 and not failed:
        if root is not None and root.get("reason") == "loss_spike":
            out["status"] = JobStatus.FAILED.value  # it ran to the end, on a diverged model
        else:
            out.update(status=JobStatus.HEALTHY.value, root_cause=None, action=Action.NONE.value, mitigation="")
            out.pop("stall", None)
        return out
    if exit_code != 0 and not failed:
        out["status"] = JobStatus.FAILED.value
        if root is None:
            out.update(action=Action.INVESTIGATE.value,
                       mitigation=f"The job {describe_exit(exit_code)} without an error in its log; "
                                  "look at the scheduler's and the node's logs (OOM killer, preemption).")
    return out


def describe_exit(exit_code: int) -> str:
    if exit_code > 128:
        import signal

        try:
            name = signal.Signals(exit_code - 128).name
        except ValueError:
            name = f"signal {exit_code - 128}"
        return f"was killed by {name} (exit code {exit_code})"
    return f"exited with code {exit_code}"
