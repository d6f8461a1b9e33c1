"""The sending half of the sidecar: the checkpoint file, the state shared with the reader,
and the sender thread that posts batches in order and moves the checkpoint on acknowledgement.

Every acknowledged batch moves its file's offset in the checkpoint; nothing else does. A 409
with the offset the server expects makes the reader seek there (the server is ahead after an
acknowledgement that was never checkpointed, behind after losing data); a 404 (the server lost
the job) starts a new job that gets every file again from its start. Retries back off
exponentially, with jitter, up to `retry_max_s`.
"""

from __future__ import annotations

import fcntl
import gzip
import itertools
import json
import logging
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from service.sidecar.tailer import Batch
from service.sidecar.wire import READ_AGE_HEADER

if TYPE_CHECKING:
    from service.sidecar.config import SidecarConfig

log = logging.getLogger("faultline.sidecar")

LATENCY_SAMPLES = 4096
"""Delivery times kept for the summary at exit: a uniform sample, so memory stays flat."""
STATE_VERSION = 1


class Checkpoint:
    """The state file: the job id and, per file, the offset the server acknowledged.

    Written whole to a temporary file and renamed over the old one, so a crash leaves the
    old or the new state, never half of one. An exclusive lock on the directory keeps a
    second sidecar (a restart while the old one still runs) from sharing it.
    """

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "state.json"
        self._lock_file = open(directory / "lock", "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(f"another sidecar is using {directory}") from None

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("checkpoint %s unreadable (%s): starting without it", self.path, exc)
            return {}
        return data if data.get("version") == STATE_VERSION else {}

    def save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": STATE_VERSION, **data}, separators=(",", ":")))
        os.replace(tmp, self.path)

    def close(self) -> None:
        self._lock_file.close()


@dataclass
class Latencies:
    """Durations, as a uniform random sample of at most `keep` of them (reservoir sampling):
    percentiles of a sidecar that runs for months in bounded memory."""

    keep: int = LATENCY_SAMPLES
    count: int = 0
    largest: float = 0.0
    samples: list[float] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def add(self, seconds: float) -> None:
        self.count += 1
        self.largest = max(self.largest, seconds)
        if len(self.samples) < self.keep:
            self.samples.append(seconds)
        else:
            slot = self.rng.randrange(self.count)
            if slot < self.keep:
                self.samples[slot] = seconds

    def percentile(self, q: float) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def describe(self) -> str:
        if not self.samples:
            return "none"
        return (f"p50 {self.percentile(0.5):.3f} s, p99 {self.percentile(0.99):.3f} s, "
                f"max {self.largest:.3f} s")


@dataclass
class Delivery:
    """How sending went, for the summary the sidecar logs when it exits."""

    ack: Latencies = field(default_factory=Latencies)
    """From the request that was acknowledged to its answer: the server's ack as seen here."""
    read_to_ack: Latencies = field(default_factory=Latencies)
    """From reading a batch's newest bytes to its acknowledgement: queueing, outages and
    retries included."""
    retries: int = 0

    def summary(self, lines: int, batches: int) -> str:
        return (f"delivered {lines} lines in {batches} batches; acknowledgement {self.ack.describe()}; "
                f"read to acknowledgement {self.read_to_ack.describe()}; {self.retries} retries")


@dataclass
class Shared:
    """What the reader and the sender share, under one condition variable."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    queue: deque[Batch] = field(default_factory=deque)
    queued_bytes: int = 0
    inflight: Batch | None = None
    epochs: dict[str, int] = field(default_factory=dict)
    resyncs: dict[str, tuple[int, int]] = field(default_factory=dict)
    acked: dict[str, tuple[int, bool]] = field(default_factory=dict)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    job_id: str | None = None
    job_closed: str | None = None
    """Why the job takes no more lines (finished elsewhere), or None."""
    smaller_batches: bool = False
    aligned: bool = False
    """The sender has compared offsets with the server since it has a job."""
    sent_lines: int = 0
    sent_batches: int = 0
    delivery: Delivery = field(default_factory=Delivery)

    def stale(self, batch: Batch) -> bool:
        return batch.epoch != self.epochs.get(batch.file_id, 0)


class Sender(threading.Thread):
    """Posts batches in order; acks move the checkpoint; 409s move the reader."""

    def __init__(self, config: SidecarConfig, shared: Shared, checkpoint: Checkpoint, stop: threading.Event):
        super().__init__(name="faultline-sender", daemon=True)
        self.config = config
        self.shared = shared
        self.checkpoint = checkpoint
        self.stop = stop
        self.client = httpx.Client(base_url=config.server, timeout=config.request_timeout_s,
                                   headers=config.headers())
        self._delay = 0.0
        self.max_body = config.tail.batch_bytes
        """The largest request body: batches are joined up to it (halved, as the reader's
        batches are, when the server refuses one as too large)."""

    # -- retries -----------------------------------------------------------------------------------
    def _backoff(self, why: str) -> None:
        self._delay = min(self.config.retry_max_s, max(0.2, self._delay * 2))
        with self.shared.cond:
            self.shared.delivery.retries += 1
        log.warning("server unavailable (%s); retrying in %.1f s", why, self._delay)
        self.stop.wait(self._delay * random.uniform(0.8, 1.2))

    def _ok(self) -> None:
        self._delay = 0.0

    # -- the job ---------------------------------------------------------------------------------
    def ensure_job(self) -> bool:
        """Create (or, by job key, find) the job; then align with what the server has."""
        if self.shared.job_id is not None:
            return True
        if self.config.once and self.config.job_key:
            return self._open_job_by_key()
        body = {"name": self.config.job_name, "framework": self.config.framework, "tags": list(self.config.tags),
                "external_id": self.config.job_key}
        try:
            response = self.client.post("/jobs", json=body)
        except httpx.HTTPError as exc:
            self._backoff(type(exc).__name__)
            return False
        if response.status_code >= 400:
            self._backoff(f"HTTP {response.status_code} creating the job: {response.text[:200]}")
            return False
        self._ok()
        with self.shared.cond:
            self.shared.job_id = response.json()["id"]
            self.shared.cond.notify_all()
        log.info("job %s (%s)", self.shared.job_id, self.config.job_name)
        self.save()
        self.align()
        return True

    def _open_job_by_key(self) -> bool:
        """An epilog attaches to the open job of its key, or does nothing: a job whose sidecar
        already reported its end needs no second one."""
        try:
            response = self.client.get("/jobs", params={"external_id": self.config.job_key})
            found = [j for j in response.json()["data"] if j["finished_at"] is None] if response.status_code == 200 \
                else None
        except (httpx.HTTPError, ValueError, KeyError):
            found = None
        if found is None:
            self._backoff("cannot look the job up")
            return False
        self._ok()
        with self.shared.cond:
            if not found:
                log.info("no open job with key %s: its end was already reported", self.config.job_key)
                self.shared.job_closed = "finished"
                self.shared.cond.notify_all()
                return False
            self.shared.job_id = found[0]["id"]
            self.shared.cond.notify_all()
        self.save()
        self.align()
        return True

    def align(self) -> None:
        """Where the server is for each file (a restart after an ack not yet checkpointed)."""
        try:
            response = self.client.get(f"/jobs/{self.shared.job_id}/sources")
            known = response.json().get("data", []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            known = []  # the 409s will align us anyway
        for item in known:
            with self.shared.cond:
                # also files this sidecar has no checkpoint for yet: with --from end it would
                # otherwise start past what the server is still missing
                acked = self.shared.acked.get(item["file"])
                if acked is None or acked[0] != item["next_offset"]:
                    self._resync(item["file"], item["next_offset"])
        with self.shared.cond:
            self.shared.aligned = True
            self.shared.cond.notify_all()

    def _resync(self, file_id: str, offset: int) -> None:
        """Under the lock: drop the file's queued batches, have the reader seek to `offset`."""
        shared = self.shared
        epoch = shared.epochs.get(file_id, 0) + 1
        shared.epochs[file_id] = epoch
        shared.resyncs[file_id] = (offset, epoch)
        shared.acked[file_id] = (offset, False)
        kept = deque(b for b in shared.queue if b.file_id != file_id)
        shared.queued_bytes -= sum(len(b.body) for b in shared.queue if b.file_id == file_id)
        shared.queue = kept
        shared.cond.notify_all()

    def _new_job(self, why: str) -> None:
        """The server lost the job: a new one gets every file again from its start."""
        log.warning("%s: creating a new job and sending the files again from their start", why)
        with self.shared.cond:
            self.shared.job_id = None
            self.shared.aligned = False
            for file_id, entry in self.shared.entries.items():
                self._resync(file_id, int(entry.get("start_offset", 0)))

    # -- sending ---------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            if self.shared.job_id is not None:
                self.align()
            while not self.stop.is_set():
                if self.shared.job_closed is not None:
                    self._discard()
                    self.stop.wait(0.5)
                    continue
                if not self.ensure_job():
                    continue
                batch = self._next()
                if batch is not None:
                    self._send(batch)
        finally:
            self.client.close()

    def _discard(self) -> None:
        """The job takes no more lines: what is queued has nowhere to go."""
        with self.shared.cond:
            self.shared.queue.clear()
            self.shared.queued_bytes = 0
            self.shared.cond.notify_all()

    def _next(self) -> Batch | None:
        with self.shared.cond:
            while not self.shared.queue and not self.stop.is_set():
                self.shared.cond.wait(0.5)
            if not self.shared.queue or self.shared.job_closed is not None:
                return None
            batch = self.coalesce()
            self.shared.inflight = batch
            return batch

    def coalesce(self) -> Batch:
        """Under the lock: the first queued batch, joined with the batches queued behind it
        that continue the same file, up to the batch size; it takes their place at the head
        of the queue. A sender that fell behind (a slow or restarting server, many busy
        files) then catches up in a few big requests instead of one small request per file
        and flush interval: each request has a fixed cost on the server."""
        queue = self.shared.queue
        first = queue[0]
        parts, size = [first], len(first.body)
        for other in itertools.islice(queue, 1, None):
            if other.file_id != first.file_id:
                continue
            last = parts[-1]
            whole = last.body.endswith(b"\n") and not last.skipping_after and len(last.body) == last.end - last.offset
            if not whole or other.epoch != first.epoch or other.offset != last.end \
                    or size + len(other.body) > self.max_body:
                break
            parts.append(other)
            size += len(other.body)
        if len(parts) == 1:
            return first
        last = parts[-1]
        joined = Batch(first.source, first.file_id, first.offset, last.end, b"".join(p.body for p in parts),
                       last.read_at, first.epoch, last.skipping_after)
        taken = {id(p) for p in parts}
        self.shared.queue = deque([joined, *(b for b in queue if id(b) not in taken)])
        return joined

    def _send(self, batch: Batch) -> None:
        while not self.stop.is_set():
            with self.shared.cond:
                if self.shared.stale(batch) or self.shared.job_id is None or self.shared.job_closed:
                    self._done(batch, acked=False)
                    return
                job_id = self.shared.job_id
            outcome = self._post(job_id, batch)
            if outcome == "retry":
                continue
            self._done(batch, acked=outcome == "acked")
            return

    def _post(self, job_id: str, batch: Batch) -> str:
        params = {"source": batch.source, "file": batch.file_id, "offset": batch.offset, "end": batch.end}
        if batch.end > batch.offset + len(batch.body):
            params["cut"] = 1  # the range holds the rest of an over-long line, skipped, not sent
        headers = {"Content-Type": "text/plain; charset=utf-8",
                   READ_AGE_HEADER: f"{max(0.0, time.time() - batch.read_at):.3f}"}
        body = batch.body
        if self.config.gzip and body:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        sent = time.perf_counter()
        try:
            response = self.client.post(f"/jobs/{job_id}/logs", params=params, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self._backoff(type(exc).__name__)
            return "retry"
        status = response.status_code
        if status == 200:
            self._ok()
            with self.shared.cond:
                self.shared.delivery.ack.add(time.perf_counter() - sent)
                self.shared.delivery.read_to_ack.add(max(0.0, time.time() - batch.read_at))
            return "acked"
        if status == 409:
            return self._conflict(batch, response)
        if status == 404:
            self._new_job(f"the server has no job {job_id}")
            return "dropped"
        if status == 413:
            self.max_body = max(1024, self.max_body // 2)
            with self.shared.cond:
                self.shared.smaller_batches = True
                self._resync(batch.file_id, batch.offset)
            return "dropped"
        self._backoff(f"HTTP {status}: {response.text[:200]}")
        return "retry"

    def _conflict(self, batch: Batch, response: httpx.Response) -> str:
        detail = response.json()
        reason = detail.get("reason")
        if reason in ("gap", "overlap"):
            expected = int(detail["expected_offset"])
            log.info("server expects byte %d of %s (sent %d): seeking there", expected, batch.source, batch.offset)
            with self.shared.cond:
                self._resync(batch.file_id, expected)
            return "dropped"
        log.warning("the job takes no more lines (%s): %s", reason, detail.get("error"))
        with self.shared.cond:
            self.shared.job_closed = str(reason)
        return "dropped"

    def _done(self, batch: Batch, *, acked: bool) -> None:
        with self.shared.cond:
            shared = self.shared
            if shared.queue and shared.queue[0] is batch:
                shared.queue.popleft()
                shared.queued_bytes -= len(batch.body)
            shared.inflight = None
            if acked and not shared.stale(batch):
                shared.acked[batch.file_id] = (batch.end, batch.skipping_after)
                shared.sent_lines += batch.lines
                shared.sent_batches += 1
            shared.cond.notify_all()
        if acked:
            self.save()

    def save(self) -> None:
        with self.shared.cond:
            files = {fid: {**entry, "offset": self.shared.acked.get(fid, (entry.get("start_offset", 0), False))[0],
                           "skipping": self.shared.acked.get(fid, (0, False))[1]}
                     for fid, entry in self.shared.entries.items()}
            files.update(self.shared.done)
            data = {"server": self.config.server, "job_name": self.config.job_name, "job_id": self.shared.job_id,
                    "files": files}
        self.checkpoint.save(data)
