"""Reading log files (or standard input) as byte chunks, and feeding them to a job."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rules.model import KeptLine
from service.errors import BadInput
from service.ingest.lines import CHUNK_BYTES, IngestCounters, iter_line_buffers
from rules.job import JobRun

KeptSink = Callable[[list[KeptLine]], None]


def read_chunks(path: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Raw chunks of a file, or of standard input for '-'."""
    if path == "-":
        stream = sys.stdin.buffer
        while chunk := stream.read(chunk_bytes):
            yield chunk
        return
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, after the generator ends
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            while chunk := handle.read(chunk_bytes):
                yield chunk
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None


def check_readable(paths: list[str]) -> None:
    """Fail before any work when a path cannot be read (exit 2, nothing half-done)."""
    for path in paths:
        if path == "-":
            continue
        p = Path(path)
        if not p.exists():
            raise BadInput(f"cannot read {path}: no such file")
        if p.is_dir():
            raise BadInput(f"cannot read {path}: it is a directory")
        try:
            with open(p, "rb"):
                pass
        except OSError as exc:
            raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None


class ProgressLine:
    """Bytes read, lines kept and throughput on standard error, only on a terminal."""

    def __init__(self, enabled: bool | None = None, every_s: float = 0.5):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.every_s = every_s
        self._start = time.monotonic()
        self._last = 0.0
        self.shown = False

    def update(self, read: int, kept: int, lines: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        rate = read / max(now - self._start, 1e-6) / 1e6
        sys.stderr.write(f"\rread {read / 1e6:,.0f} MB, {lines:,} lines, kept {kept:,}  ({rate:,.0f} MB/s)  ")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def feed_path(run: JobRun, path: str, *, progress: ProgressLine | None = None,
              on_kept: KeptSink | None = None, max_bytes: int | None = None) -> None:
    """Stream one file into a job: gzip by magic bytes, whole-line buffers, bounded memory."""
    counters = IngestCounters()
    name = "<stdin>" if path == "-" else path
    gzip = True if path.endswith(".gz") else None
    for buffer in iter_line_buffers(read_chunks(path), name=name, gzip=gzip, max_bytes=max_bytes, counters=counters):
        kept = run.feed(name, buffer, raw_bytes=0)
        if on_kept is not None and kept:
            on_kept(kept)
        if progress is not None:
            stream = run.sources[name].stream
            progress.update(counters.bytes_in, stream.lines_kept, stream.lines_in)
    run.bytes_in += counters.bytes_in
    run.lines_cut += counters.lines_cut
