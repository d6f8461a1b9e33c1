"""`faultline tail`: follows a job's log files and ships their lines to the service.

Two threads. The reader (service/sidecar/tailer.py) turns files into batches of whole lines and
queues them, up to `buffer_bytes`: past that it stops reading and the files themselves are
the buffer (backpressure, nothing dropped). The sender (service/sidecar/sender.py) posts batches in order to
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

import glob
import hashlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx

from service.sidecar.config import SidecarConfig
from service.sidecar.sender import Checkpoint, Sender, Shared
from service.sidecar.tailer import Batch, Tailer, source_name

log = logging.getLogger("faultline.sidecar")

STOP_DRAIN_S = 10.0
"""Stopped in follow mode: a short drain, within a pod's termination grace period."""
DONE_KEPT = 256
"""Finished (let-go) files remembered in the checkpoint, so a restart does not re-read them."""


def default_state_dir(data_dir: Path, server: str, job: str, paths: tuple[str, ...]) -> Path:
    """One checkpoint directory per (server, job, files): two sidecars never share one."""
    digest = hashlib.sha256("\0".join([server, job, *sorted(paths)]).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", job).strip("-")[:60] or "job"
    return data_dir / "sidecar" / f"{slug}-{digest}"


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
            with self.shared.cond:
                log.info("%s", self.shared.delivery.summary(self.shared.sent_lines, self.shared.sent_batches))
            if self.tailer.truncated_unread:
                log.warning("%d file truncation(s) without a rotated copy to read from (copytruncate with another "
                            "naming than x.log.1 or x.log-<date>?): lines written just before each may be lost",
                            self.tailer.truncated_unread)
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
        if finish and self.config.error_files and self.shared.job_closed is None and not self.abort.is_set():
            # written as the workers die, so read only now; each is a source of its own
            self._deliver(self._error_file_batches())
            self._drain(max(0.0, deadline - time.monotonic()))
        if finish and self.shared.job_closed is None and not self.abort.is_set():
            self._report_finish(exit_code, deadline)
        return exit_code if exit_code is not None else 0

    def _error_file_batches(self) -> list[Batch]:
        """torchrun's error files of the ended job, as the CLI's `--error-file` reads them
        (rules/error_files.py): one whole batch each, idempotent by its path."""
        from rules.error_files import MAX_ERROR_FILE_BYTES, NotAnErrorFile, error_file_lines

        paths = list(dict.fromkeys(p for pattern in self.config.error_files
                                   for p in sorted(glob.glob(pattern, recursive=True))))
        batches = []
        for path in paths:
            try:
                with open(path, "rb") as handle:
                    body = error_file_lines(handle.read(MAX_ERROR_FILE_BYTES + 1), path)
            except (OSError, NotAnErrorFile) as exc:
                log.warning("not sent: %s: %s", path, exc)
                continue
            file_id = "error-file-" + hashlib.sha256(path.encode()).hexdigest()[:16]
            batches.append(Batch(source=source_name(path, self.config.tail.source_prefix), file_id=file_id,
                                 offset=0, end=len(body), body=body, read_at=time.time(), epoch=0,
                                 skipping_after=False))
        if paths:
            log.info("sending %d torchrun error file(s) of %d found", len(batches), len(paths))
        return batches

    def _report_finish(self, exit_code: int | None, deadline: float) -> None:
        with self.shared.cond:
            while self.shared.job_id is None and time.monotonic() < deadline:
                self.shared.cond.wait(0.2)  # the sender creates it as soon as the server answers
            job_id = self.shared.job_id
        if job_id is None:
            log.warning("the job was never created; exit status %s not reported", exit_code)
            return
        with httpx.Client(base_url=self.config.server, timeout=self.config.request_timeout_s,
                          headers=self.config.headers()) as client:
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
