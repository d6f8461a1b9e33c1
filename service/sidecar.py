"""`faultline tail`: follows a job's log files and ships their lines to the service.

Two threads. The reader (service/tailer.py) turns files into batches of whole lines and
queues them, up to `buffer_bytes`: past that it stops reading and the files themselves are
the buffer (backpressure, nothing dropped). The sender posts batches in order to
`POST /jobs/{id}/logs` and, only once the server has acknowledged a batch, writes the
file's new offset to the checkpoint file, so a crash of either side loses nothing: what was
sent but not checkpointed is sent again and the server counts it once (its ledger is
idempotent by source, file and offset). When the server answers 409 with the offset it
expects (it is ahead after such a crash, or behind after losing data), the sender has the
reader seek there. While the server is down, the sender retries with exponential backoff
and the reader keeps reading within its bound.

With a command (`faultline tail ... -- torchrun ...`), the sidecar runs it with its output
going to a file (`--tee`) that it also follows and echoes to standard output: the command
never waits for the sidecar or the network, and survives the sidecar's death. When the
command ends, every file is read to its end, partial last lines included, the rest is
sent, and `POST /jobs/{id}/finish` reports the exit status, which the sidecar then exits
with.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from service.tailer import Batch, TailConfig, Tailer

log = logging.getLogger("faultline.sidecar")

READ_AGE_HEADER = "X-Faultline-Read-Age"
STATE_VERSION = 1
STOP_DRAIN_S = 10.0
"""Stopped in follow mode: a short drain, within a pod's termination grace period."""
DONE_KEPT = 256
"""Finished (let-go) files remembered in the checkpoint, so a restart does not re-read them."""


@dataclass(frozen=True)
class SidecarConfig:
    server: str
    job_name: str
    paths: tuple[str, ...]
    state_dir: Path
    tail: TailConfig = field(default_factory=TailConfig)
    framework: str | None = None
    tags: tuple[str, ...] = ()
    job_key: str | None = None
    """The scheduler's id (Slurm job id, pod uid): sidecars of one job on several nodes share it."""
    buffer_bytes: int = 32 << 20
    poll_interval_s: float = 0.2
    glob_interval_s: float = 1.0
    drain_timeout_s: float = 60.0
    """At the end: how long to keep trying to deliver what is left."""
    retry_max_s: float = 10.0
    request_timeout_s: float = 60.0
    gzip: bool = False
    once: bool = False
    """Read what is there, send it, exit (an epilog)."""
    exit_code: int | None = None
    """With once: report this exit status (finish the job)."""
    finish_on_stop: bool = False
    """Follow mode: report the end of the job when stopped (SIGTERM), e.g. as a pod's sidecar."""
    exit_code_file: Path | None = None
    """Where the training writes its exit status, read when finishing."""
    command: tuple[str, ...] = ()
    tee: Path | None = None

    def __post_init__(self) -> None:
        if not self.server.startswith(("http://", "https://")):
            raise ValueError(f"--server must be an http(s) URL, got {self.server!r}")
        if not self.paths and not self.command:
            raise ValueError("give at least one PATH to follow, or a command after --")
        if self.buffer_bytes < self.tail.batch_bytes:
            raise ValueError(f"--buffer-bytes ({self.buffer_bytes}) must hold at least one batch "
                             f"({self.tail.batch_bytes})")


def default_state_dir(data_dir: Path, server: str, job: str, paths: tuple[str, ...]) -> Path:
    """One checkpoint directory per (server, job, files): two sidecars never share one."""
    digest = hashlib.sha256("\0".join([server, job, *sorted(paths)]).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", job).strip("-")[:60] or "job"
    return data_dir / "sidecar" / f"{slug}-{digest}"


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
                                   headers={"User-Agent": "faultline-sidecar/1"})
        self._delay = 0.0

    # -- retries -----------------------------------------------------------------------------------
    def _backoff(self, why: str) -> None:
        self._delay = min(self.config.retry_max_s, max(0.2, self._delay * 2))
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
            batch = self.shared.queue[0]
            self.shared.inflight = batch
            return batch

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
        headers = {"Content-Type": "text/plain; charset=utf-8",
                   READ_AGE_HEADER: f"{max(0.0, time.time() - batch.read_at):.3f}"}
        body = batch.body
        if self.config.gzip and body:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        try:
            response = self.client.post(f"/jobs/{job_id}/logs", params=params, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self._backoff(type(exc).__name__)
            return "retry"
        status = response.status_code
        if status == 200:
            self._ok()
            return "acked"
        if status == 409:
            return self._conflict(batch, response)
        if status == 404:
            self._new_job(f"the server has no job {job_id}")
            return "dropped"
        if status == 413:
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


class Command:
    """The training command, its output into the tee file (echoed to our stdout)."""

    def __init__(self, argv: tuple[str, ...], tee: Path):
        tee.parent.mkdir(parents=True, exist_ok=True)
        self.tee = tee
        self._out = open(tee, "ab")  # noqa: SIM115 - the child's stdout, closed in wait()
        self._echo_from = self._out.tell()
        env = {**os.environ}
        env.setdefault("PYTHONUNBUFFERED", "1")  # Python children would hold their lines in a buffer
        try:
            self.proc = subprocess.Popen(list(argv), stdout=self._out, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            self._out.close()
            raise RuntimeError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        self._echo = threading.Thread(target=self._echo_output, name="faultline-echo", daemon=True)
        self._echo.start()

    def _echo_output(self) -> None:
        """Standard output shows the command's output: follow the tee file until it ends."""
        out = sys.stdout.buffer
        with open(self.tee, "rb") as handle:
            handle.seek(self._echo_from)
            while True:
                data = handle.read(1 << 16)
                if data:
                    out.write(data)
                    out.flush()
                elif self.proc.poll() is not None:
                    rest = handle.read()
                    if rest:
                        out.write(rest)
                        out.flush()
                    return
                else:
                    time.sleep(0.05)

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status as a shell reports it (128 + N when killed by signal N)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._echo.join(timeout=5)
        self._out.close()
        return 128 - code if code < 0 else code


class Sidecar:
    def __init__(self, config: SidecarConfig):
        self.config = config
        paths = list(config.paths)
        if config.command and config.tee is not None and str(config.tee) not in paths:
            paths.append(str(config.tee))
        self.tailer = Tailer(paths, config.tail)
        self.checkpoint = Checkpoint(config.state_dir)
        self.shared = Shared()
        self.stop_reading = threading.Event()
        self.abort = threading.Event()
        self.stop_sending = threading.Event()
        self.sender = Sender(config, self.shared, self.checkpoint, self.stop_sending)
        self.command: Command | None = None
        self._last_scan = 0.0
        self._registered: tuple[str | None, ...] = ()
        self._closing: dict[str, tuple[int, bool]] = {}

    # -- start -----------------------------------------------------------------------------------
    def _restore(self) -> None:
        state = self.checkpoint.load()
        files = state.get("files", {})
        self.tailer.resume(files)
        for file_id, entry in files.items():
            if entry.get("done"):
                self.shared.done[file_id] = entry
            else:
                self.shared.acked[file_id] = (int(entry["offset"]), bool(entry.get("skipping")))
        if state.get("job_id") and not self.config.command and state.get("server") == self.config.server:
            self.shared.job_id = state["job_id"]  # a restart continues its job; a new command is a new run

    def run(self) -> int:
        self._restore()
        self.sender.start()
        if self.config.command:
            tee = self.config.tee or self.config.state_dir / "output.log"
            self.command = Command(self.config.command, tee)
            if str(tee) not in self.tailer.patterns:
                self.tailer.patterns.append(str(tee))
        self._install_signals()
        try:
            exit_code = self._follow()
        finally:
            self.stop_sending.set()
            self.sender.join(timeout=max(5.0, self.config.request_timeout_s))
            self.sender.save()
            self.tailer.close()
            self.checkpoint.close()
        return exit_code

    def _install_signals(self) -> None:
        def stop(signum: int, _frame: object) -> None:
            if self.command is None:
                # the first signal stops following (and drains); a second, or any during
                # --once, gives up on the drain (the checkpoint keeps what was acknowledged)
                if self.stop_reading.is_set() or self.config.once:
                    self.abort.set()
                self.stop_reading.set()
            elif signum == signal.SIGTERM:
                # the command decides how to end and we follow it to its end; SIGINT from a
                # terminal already reached it (same process group), so it is not sent twice
                self.command.signal(signum)

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)

    # -- the reading loop ------------------------------------------------------------------------
    def _follow(self) -> int:
        while True:
            if self.config.once:
                return self._finish(self.config.exit_code, finish=self.config.exit_code is not None)
            if self.command is not None:
                code = self.command.wait(timeout=0)
                if code is not None:
                    return self._finish(code, finish=True)
            if self.stop_reading.is_set():
                if self.config.finish_on_stop:
                    return self._finish(self._exit_code_from_file(), finish=True)
                # what is not delivered now is sent after a restart: the checkpoint only moves on acks
                self._deliver(self.tailer.take(close_open=True))
                self._drain(min(self.config.drain_timeout_s, STOP_DRAIN_S))
                return 0
            if self.shared.job_closed is not None and self.command is None:
                log.warning("stopping: the job takes no more lines")
                return 0
            if self._step() == 0:
                self.stop_reading.wait(self.config.poll_interval_s)

    def _step(self) -> int:
        """One round: resyncs, a rescan when due, a read within the buffer bound, queueing."""
        with self.shared.cond:
            resyncs, self.shared.resyncs = self.shared.resyncs, {}
            if self.shared.smaller_batches:
                self.shared.smaller_batches = False
                tail = self.tailer.config
                self.tailer.config = replace(tail, batch_bytes=max(1024, tail.batch_bytes // 2))
        for file_id, (offset, epoch) in resyncs.items():
            self.tailer.resync(file_id, offset, epoch)
        now = time.monotonic()
        if now - self._last_scan >= self.config.glob_interval_s:
            self._last_scan = now
            self.tailer.scan()
        self._register()
        with self.shared.cond:
            queued = self.shared.queued_bytes
        room = self.config.buffer_bytes - queued - self.tailer.open_bytes()
        read = self.tailer.poll(max(room, 0))  # with no room it reads nothing, but timeouts still run
        # the buffer is all open batches (many files, none full yet): send them as they are,
        # or nothing would ever leave
        self._deliver(self.tailer.take(close_open=room <= 0 and queued == 0))
        return read

    def _register(self) -> None:
        """Tell the checkpoint about the files being followed. A file let go (rotated and
        read to its end) or replaced (truncated: a new generation) leaves the checkpoint once
        its last batch is acknowledged; let-go files are remembered as done."""
        ids = tuple(t.file_id for t in self.tailer.tracked())
        if ids == self._registered and not self.tailer.closed and not self._closing:
            return
        self._registered = ids
        with self.shared.cond:
            shared = self.shared
            for tracked in self.tailer.tracked():
                if tracked.file_id not in shared.entries:
                    log.info("following %s from byte %d", tracked.path, tracked.read_pos)
                shared.entries[tracked.file_id] = tracked.entry()
                shared.acked.setdefault(tracked.file_id, (tracked.start_offset, tracked.skipping))
            for file_id, final, done in self.tailer.closed:
                self._closing[file_id] = (final, done)
            self.tailer.closed = []
            for file_id, (final, done) in list(self._closing.items()):
                if shared.acked.get(file_id, (0, False))[0] < final and file_id in shared.entries \
                        and shared.job_closed is None:
                    continue
                del self._closing[file_id]
                entry = shared.entries.pop(file_id, None)
                if done and entry is not None:
                    shared.done[file_id] = {**entry, "offset": final, "done": True}
            while len(shared.done) > DONE_KEPT:
                shared.done.pop(next(iter(shared.done)))

    def _deliver(self, batches: list[Batch]) -> None:
        if not batches:
            return
        with self.shared.cond:
            for batch in batches:
                if self.shared.stale(batch) or self.shared.job_closed is not None:
                    continue
                self.shared.queue.append(batch)
                self.shared.queued_bytes += len(batch.body)
            self.shared.cond.notify_all()

    # -- the end ---------------------------------------------------------------------------------
    def _drain(self, timeout_s: float) -> bool:
        """Wait until everything queued is acknowledged (or the time is up)."""
        deadline = time.monotonic() + timeout_s
        with self.shared.cond:
            while self.shared.queue or self.shared.inflight is not None:
                left = deadline - time.monotonic()
                if left <= 0 or self.shared.job_closed is not None or self.abort.is_set():
                    break
                self.shared.cond.wait(min(left, 0.5))
            return not self.shared.queue and self.shared.inflight is None

    def _finish(self, exit_code: int | None, *, finish: bool) -> int:
        """Read every file to its end (partial lines too), deliver it, report the exit status.

        Settled means: every file read to its end, nothing queued or in flight, and the
        sender aligned with the server (a seek the server asked for may still add work)."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        self._last_scan = 0.0
        settled = False
        while time.monotonic() < deadline and not self.abort.is_set():
            if self._step():
                continue
            if not self.tailer.at_end():
                time.sleep(0.05)  # no room in the buffer: the server is behind
                continue
            self._register()
            self._deliver(self.tailer.take(close_open=True, partial=True))
            with self.shared.cond:
                shared = self.shared
                if shared.job_closed is not None:
                    break
                settled = (shared.aligned and not shared.queue and shared.inflight is None
                           and not shared.resyncs and self.tailer.open_bytes() == 0)
                if settled:
                    break
                shared.cond.wait(0.1)
        if not settled:
            log.warning("not everything was delivered before the drain timeout; the checkpoint keeps the "
                        "offsets, a later `faultline tail --once` sends the rest")
        if finish and self.shared.job_closed is None and not self.abort.is_set():
            self._report_finish(exit_code, deadline)
        return exit_code if exit_code is not None else 0

    def _report_finish(self, exit_code: int | None, deadline: float) -> None:
        with self.shared.cond:
            while self.shared.job_id is None and time.monotonic() < deadline:
                self.shared.cond.wait(0.2)  # the sender creates it as soon as the server answers
            job_id = self.shared.job_id
        if job_id is None:
            log.warning("the job was never created; exit status %s not reported", exit_code)
            return
        with httpx.Client(base_url=self.config.server, timeout=self.config.request_timeout_s) as client:
            delay = 0.2
            while True:
                try:
                    response = client.post(f"/jobs/{job_id}/finish", json={"exit_code": exit_code})
                    if response.status_code < 500:
                        if response.status_code >= 400:
                            log.warning("finish refused: HTTP %d %s", response.status_code, response.text[:200])
                        else:
                            diagnosis = response.json().get("diagnosis") or {}
                            root = diagnosis.get("root_cause") or {}
                            log.info("job %s finished: %s %s", job_id, diagnosis.get("status"),
                                     root.get("reason", ""))
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() + delay > deadline:
                    log.warning("could not report the exit status before the drain timeout")
                    return
                time.sleep(delay)
                delay = min(delay * 2, self.config.retry_max_s)

    def _exit_code_from_file(self) -> int | None:
        path = self.config.exit_code_file
        if path is None:
            return None
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None
