"""Following log files the way Vector's and Fluent Bit's file sources do; no network here.

- Files are found by globs, re-scanned for new ones (one file per rank appearing over time).
- A file is known by its inode while it is open and by a fingerprint of its first line (up
  to FINGERPRINT_BYTES) across restarts: a rotated file (renamed, a new one created under
  the old name) keeps being read through its open descriptor to its end, and after a
  restart it is found again in its directory by inode and fingerprint, even if the globs
  no longer match its new name. The inode also tells apart files whose first lines are the
  same (every rank printing the same banner), the failure mode of a fingerprint alone.
- Truncation (the size drops below the read position, or the first line changed) starts a
  new generation of the file, read from byte 0 under a new file id.
- Only whole lines leave: a partial last line waits for its end, or for
  `partial_timeout_s` of silence; a line longer than `max_line_bytes` keeps its head and
  the rest is skipped up to the next line end.
- Lines are cut into batches of about `batch_bytes`, each the bytes [offset, end) of one
  file; the next batch of a file starts where the previous one ended.

The file id sent to the server is `<fingerprint>.<inode>.<generation>`.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

FINGERPRINT_BYTES = 1024
DONE_REMEMBERED = 4096
"""Let-go files remembered (a job rotating every rank file hourly for months stays bounded)."""
_ROTATED_SUFFIX = re.compile(r"\.\d+$")


@dataclass(frozen=True)
class TailConfig:
    read_from: str = "beginning"
    """`beginning` or `end`: where to start in files present at startup without a checkpoint."""
    max_line_bytes: int = 256 << 10
    batch_bytes: int = 4 << 20
    max_read_bytes: int = 1 << 20
    """Per file and poll, so one busy file cannot starve the others."""
    partial_timeout_s: float = 5.0
    batch_timeout_s: float = 0.5
    """An open batch is sent after this long even if it is small."""
    rotate_wait_s: float = 10.0
    """A rotated or deleted file is read until it has been idle this long."""
    source_prefix: str = ""

    def __post_init__(self) -> None:
        if self.read_from not in ("beginning", "end"):
            raise ValueError(f"read_from must be 'beginning' or 'end', got {self.read_from!r}")
        if self.max_line_bytes < 64:
            raise ValueError(f"max_line_bytes must be at least 64, got {self.max_line_bytes}")
        if self.batch_bytes < 1024:
            raise ValueError(f"batch_bytes must be at least 1024, got {self.batch_bytes}")


@dataclass
class Batch:
    source: str
    file_id: str
    offset: int
    end: int
    body: bytes
    read_at: float
    """Wall-clock time the newest bytes were read (the server learns their age)."""
    epoch: int
    skipping_after: bool
    """The batch ends inside an over-long line whose rest is being skipped."""

    @property
    def lines(self) -> int:
        return self.body.count(b"\n")


def fingerprint(fd: int) -> str | None:
    """sha256 of the first line (or first FINGERPRINT_BYTES); None until there is one."""
    head = os.pread(fd, FINGERPRINT_BYTES, 0)
    end = head.find(b"\n")
    if end >= 0:
        head = head[:end + 1]
    elif len(head) < FINGERPRINT_BYTES:
        return None
    return hashlib.sha256(head).hexdigest()[:16]


def source_name(path: str, prefix: str = "") -> str:
    """What the diagnosis calls the file: its path without a rotation suffix (`x.log.1`
    continues `x.log`), bounded to what the server stores."""
    return (prefix + _ROTATED_SUFFIX.sub("", path))[-512:]


def _first_line_end(data: bytes) -> int:
    """Index after the first line end (CRLF counts as one), 0 if there is none."""
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    if not ends:
        return 0
    i = min(ends)
    if data[i:i + 2] == b"\r\n":
        i += 1
    return i + 1


def _line_end(buffer: bytes | bytearray) -> int:
    """Index after the last complete line: LF, or a CR not at the very end (a CR there may
    be the first half of CRLF)."""
    return max(buffer.rfind(b"\n"), buffer.rfind(b"\r", 0, len(buffer) - 1)) + 1


@dataclass
class Tracked:
    fd: int
    path: str
    source: str
    dev: int
    ino: int
    start_offset: int
    read_pos: int
    generation: int = 0
    fingerprint: str | None = None
    skipping: bool = False
    epoch: int = 0
    rotated: bool = False
    pending: bytearray = field(default_factory=bytearray)
    pending_at: float = 0.0
    parts: list[bytes] = field(default_factory=list)
    part_bytes: int = 0
    batch_start: int = 0
    batch_end: int = 0
    batch_opened: float = 0.0
    read_at: float = 0.0
    idle_since: float = 0.0
    lines_cut: int = 0

    @property
    def file_id(self) -> str | None:
        if self.fingerprint is None:
            return None
        return f"{self.fingerprint}.{self.ino:x}.{self.generation}"

    def entry(self) -> dict[str, Any]:
        """What the checkpoint file stores about it (the offset comes from the acks)."""
        return {"path": self.path, "source": self.source, "dev": self.dev, "ino": self.ino,
                "fingerprint": self.fingerprint, "generation": self.generation, "start_offset": self.start_offset}


class Tailer:
    """Single-threaded: one reader owns it; batches leave through `take()`."""

    def __init__(self, patterns: Iterable[str], config: TailConfig | None = None, *,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.patterns = list(patterns)
        self.config = config or TailConfig()
        self.monotonic = monotonic
        self.wall = wall
        self.files: dict[tuple[int, int], Tracked] = {}
        self.ready: list[Batch] = []
        self.closed: list[tuple[str, int, bool]] = []
        """(file id, final offset, let go) of files no longer read: let go (True) after a
        rotation, or replaced by a new generation (False) after a truncation."""
        self.done: dict[tuple[int, int], str | None] = {}
        """Files let go, by (dev, inode), with their fingerprint: a rotated file the globs
        still match is not read a second time."""
        self.truncated_unread = 0
        """Truncations with no rotated copy to read the old content's rest from: lines written
        just before each may be lost (the delivery summary says how many)."""
        self._scanned = False

    # -- finding files ---------------------------------------------------------------------------
    def resume(self, entries: dict[str, dict[str, Any]]) -> None:
        """Reopen checkpointed files where their acknowledged offset says, wherever they are now."""
        for entry in entries.values():
            if entry.get("done"):
                self.done[(entry["dev"], entry["ino"])] = entry.get("fingerprint")
                continue
            found = self._locate(entry)
            if found is None:
                continue
            path, st = found
            key = (st.st_dev, st.st_ino)
            if key in self.files:
                continue
            fd = os.open(path, os.O_RDONLY)
            tracked = Tracked(fd, path, entry["source"], st.st_dev, st.st_ino, int(entry.get("start_offset", 0)),
                              int(entry["offset"]), generation=int(entry.get("generation", 0)),
                              skipping=bool(entry.get("skipping", False)))
            tracked.batch_start = tracked.batch_end = tracked.read_pos
            now_fp = fingerprint(fd)
            if now_fp != entry.get("fingerprint") or st.st_size < tracked.read_pos:
                # truncated or rewritten while we were away: a new generation from byte 0
                tracked.generation += 1
                tracked.read_pos = tracked.batch_start = tracked.batch_end = tracked.start_offset = 0
                tracked.skipping = False
            tracked.fingerprint = now_fp
            tracked.idle_since = self.monotonic()
            self.files[key] = tracked

    @staticmethod
    def _locate(entry: dict[str, Any]) -> tuple[str, os.stat_result] | None:
        """The file of a checkpoint entry: at its last path, else renamed within its directory."""
        path = entry["path"]
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == (entry["dev"], entry["ino"]):
                return path, st
        except OSError:
            pass
        folder = os.path.dirname(path) or "."
        try:
            with os.scandir(folder) as listing:
                for item in listing:
                    try:
                        st = item.stat()
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == (entry["dev"], entry["ino"]) and stat.S_ISREG(st.st_mode):
                        return item.path, st
        except OSError:
            pass
        return None

    def scan(self) -> None:
        """Pick up new files; notice rotation (the path now names another file, or none)."""
        seen: dict[str, os.stat_result] = {}
        for pattern in self.patterns:
            for path in sorted(glob.glob(pattern, recursive=True)):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    seen[path] = st
        at_start = not self._scanned
        self._scanned = True
        for path, st in seen.items():
            key = (st.st_dev, st.st_ino)
            tracked = self.files.get(key)
            if tracked is not None:
                if tracked.path != path and tracked.rotated:
                    tracked.path = path  # renamed to a name the globs match; still rotated
                continue
            if key in self.done and self._same_file(path, self.done[key]):
                continue
            self._open(path, st, at_start=at_start)
        for tracked in self.files.values():
            st = seen.get(tracked.path)
            if st is None or (st.st_dev, st.st_ino) != (tracked.dev, tracked.ino):
                # renamed or deleted: read it until it has been idle for rotate_wait_s (sticky,
                # so a rotated file the globs also match is let go all the same)
                tracked.rotated = True
            elif tracked.fingerprint is not None:
                self._check_rewritten(tracked)

    @staticmethod
    def _same_file(path: str, expected: str | None) -> bool:
        """A let-go file seen again, not a new file that reuses its inode."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return True
        try:
            return fingerprint(fd) == expected
        finally:
            os.close(fd)

    def _open(self, path: str, st: os.stat_result, *, at_start: bool) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        start = 0
        skipping = False
        if at_start and self.config.read_from == "end" and st.st_size:
            start = st.st_size
            # starting mid-line would send the rest of a line as a line of its own
            skipping = os.pread(fd, 1, start - 1) not in (b"\n", b"\r")
        tracked = Tracked(fd, path, source_name(path, self.config.source_prefix), st.st_dev, st.st_ino,
                          start, start, skipping=skipping)
        tracked.batch_start = tracked.batch_end = start
        tracked.fingerprint = fingerprint(fd)
        tracked.idle_since = self.monotonic()
        self.files[(st.st_dev, st.st_ino)] = tracked

    def _check_rewritten(self, tracked: Tracked) -> None:
        if fingerprint(tracked.fd) != tracked.fingerprint:
            self._new_generation(tracked)

    def _new_generation(self, tracked: Tracked) -> None:
        """Truncated: what was read is sent, then what the old content held past it if a
        rotated copy of it is found (logrotate's copytruncate: the lines written between
        the last read and the truncation are only in the copy); start over."""
        self._drain_copy(tracked)
        self._close_batch(tracked)
        if tracked.file_id is not None:
            self.closed.append((tracked.file_id, tracked.batch_start, False))
        tracked.generation += 1
        tracked.read_pos = tracked.batch_start = tracked.batch_end = tracked.start_offset = 0
        tracked.pending.clear()
        tracked.skipping = False
        tracked.fingerprint = fingerprint(tracked.fd)

    def _drain_copy(self, tracked: Tracked) -> None:
        """The old content's unread rest, from its rotated copy (`x.log.1`, or `x.log-<date>`
        with dateext): the copy whose first line is the file's first line and that runs past
        what was read. None found: bytes written just before the truncation may be lost, and
        the tailer counts it (`truncated_unread`)."""
        best = None
        for candidate in (tracked.path + ".1", *glob.glob(glob.escape(tracked.path) + "-*")):
            try:
                fd = os.open(candidate, os.O_RDONLY)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if st.st_size > tracked.read_pos and fingerprint(fd) == tracked.fingerprint and (
                        best is None or st.st_mtime > best[1].st_mtime):
                    if best is not None:
                        os.close(best[0])
                    best, fd = (fd, st), -1
            finally:
                if fd >= 0:
                    os.close(fd)
        if best is None:
            self.truncated_unread += 1
            return
        fd, st = best
        try:
            now = self.monotonic()
            while tracked.read_pos < st.st_size:
                data = os.pread(fd, min(self.config.max_read_bytes, st.st_size - tracked.read_pos), tracked.read_pos)
                if not data:
                    break
                tracked.read_pos += len(data)
                self._split(tracked, data, now)
            if tracked.pending:  # the old content's last line, left without its end
                tracked.pending.append(0x0A)
                self._add(tracked, bytes(tracked.pending), tracked.read_pos)
                tracked.pending.clear()
        finally:
            os.close(fd)

    # -- reading ---------------------------------------------------------------------------------
    def poll(self, budget: int) -> int:
        """Read new bytes (at most `budget` in all); returns how many were read."""
        total = 0
        now = self.monotonic()
        for tracked in list(self.files.values()):
            if budget - total <= 0:
                break
            total += self._read(tracked, budget - total, now)
        for tracked in list(self.files.values()):
            self._timeouts(tracked, now)
        return total

    def _read(self, tracked: Tracked, budget: int, now: float) -> int:
        if tracked.fingerprint is None:
            tracked.fingerprint = fingerprint(tracked.fd)
            if tracked.fingerprint is None:
                return 0  # no complete first line yet
        size = os.fstat(tracked.fd).st_size
        if size < tracked.read_pos:
            self._new_generation(tracked)
            if tracked.fingerprint is None:
                return 0
        want = min(size - tracked.read_pos, self.config.max_read_bytes, budget)
        if want <= 0:
            return 0
        data = os.pread(tracked.fd, want, tracked.read_pos)
        if not data:
            return 0
        tracked.read_pos += len(data)
        tracked.read_at = self.wall()
        tracked.idle_since = now
        self._split(tracked, data, now)
        return len(data)

    def _split(self, tracked: Tracked, data: bytes, now: float) -> None:
        if tracked.skipping:
            end = _first_line_end(data)
            if end == 0:
                return  # still inside the over-long line; the bytes go with the next batch
            data = data[end:]
            tracked.skipping = False
        buffer = bytes(tracked.pending) + data if tracked.pending else data
        cut = _line_end(buffer)
        rest = buffer[cut:]
        if cut:
            self._add(tracked, buffer[:cut], tracked.read_pos - len(rest))
        if rest:
            tracked.pending = bytearray(rest)
            tracked.pending_at = now
        else:
            tracked.pending.clear()
        if len(tracked.pending) > self.config.max_line_bytes:
            head = bytes(tracked.pending[:self.config.max_line_bytes]) + b"\n"
            tracked.pending.clear()
            tracked.skipping = True
            tracked.lines_cut += 1
            self._add(tracked, head, tracked.read_pos)

    def _add(self, tracked: Tracked, piece: bytes, end: int) -> None:
        """Whole lines whose file range ends at `end`, into the file's open batch."""
        limit = self.config.batch_bytes
        while piece:
            if not tracked.parts:
                tracked.batch_opened = self.monotonic()
            room = limit - tracked.part_bytes
            if len(piece) <= room:
                tracked.parts.append(piece)
                tracked.part_bytes += len(piece)
                tracked.batch_end = end
                if tracked.part_bytes >= limit:
                    self._close_batch(tracked)
                return
            split = piece.rfind(b"\n", 0, room) + 1
            if split == 0:
                if tracked.parts:
                    self._close_batch(tracked)
                    continue
                split = piece.find(b"\n") + 1 or len(piece)
            head, piece = piece[:split], piece[split:]
            tracked.parts.append(head)
            tracked.part_bytes += len(head)
            tracked.batch_end = end - len(piece)
            self._close_batch(tracked)

    def _close_batch(self, tracked: Tracked) -> None:
        end = tracked.batch_end
        if tracked.skipping and not tracked.pending:
            end = max(end, tracked.read_pos)  # the skipped bytes read so far belong to this range
        if not tracked.parts and end <= tracked.batch_start:
            return
        file_id = tracked.file_id
        if file_id is None:
            return
        self.ready.append(Batch(tracked.source, file_id, tracked.batch_start, end, b"".join(tracked.parts),
                                tracked.read_at or self.wall(), tracked.epoch, tracked.skipping))
        tracked.parts, tracked.part_bytes = [], 0
        tracked.batch_start = tracked.batch_end = end

    def _timeouts(self, tracked: Tracked, now: float) -> None:
        cfg = self.config
        if (tracked.pending and now - tracked.pending_at >= cfg.partial_timeout_s
                and os.fstat(tracked.fd).st_size <= tracked.read_pos):
            # the writer went quiet mid-line; a line merely not read yet (the buffer is full,
            # or the read stopped mid-line) is not partial and must not be split
            self._flush_partial(tracked)
        if tracked.parts and now - tracked.batch_opened >= cfg.batch_timeout_s:
            self._close_batch(tracked)
        if (tracked.rotated and now - tracked.idle_since >= cfg.rotate_wait_s
                and os.fstat(tracked.fd).st_size <= tracked.read_pos):
            self._let_go(tracked)

    def _flush_partial(self, tracked: Tracked) -> None:
        """Give up waiting for the end of the last line: it leaves as a line of its own."""
        if tracked.pending:
            piece = bytes(tracked.pending) + b"\n"
            tracked.pending.clear()
            self._add(tracked, piece, tracked.read_pos)

    def _let_go(self, tracked: Tracked) -> None:
        self._flush_partial(tracked)
        self._close_batch(tracked)
        os.close(tracked.fd)
        del self.files[(tracked.dev, tracked.ino)]
        self.done[(tracked.dev, tracked.ino)] = tracked.fingerprint
        while len(self.done) > DONE_REMEMBERED:
            del self.done[next(iter(self.done))]
        if tracked.file_id is not None:
            self.closed.append((tracked.file_id, tracked.batch_start, True))

    # -- leaving ---------------------------------------------------------------------------------
    def take(self, *, close_open: bool = False, partial: bool = False) -> list[Batch]:
        """Batches ready to send; `close_open` also closes small open batches, `partial`
        also flushes partial last lines (the writers are done)."""
        for tracked in list(self.files.values()):
            if partial:
                self._flush_partial(tracked)
            if close_open:
                self._close_batch(tracked)
        out, self.ready = self.ready, []
        return out

    def open_bytes(self) -> int:
        """Bytes read but not yet handed out (open batches and partial lines)."""
        return sum(t.part_bytes + len(t.pending) for t in self.files.values())

    def at_end(self) -> bool:
        """Every file read to its current end (fingerprinted or not)."""
        for tracked in self.files.values():
            if tracked.fingerprint is None and fingerprint(tracked.fd) is None:
                continue
            if os.fstat(tracked.fd).st_size > tracked.read_pos:
                return False
        return True

    def resync(self, file_id: str, offset: int, epoch: int) -> bool:
        """Go back (or forward) to `offset` of a file, as the server asks; False if the file
        is no longer open."""
        for tracked in self.files.values():
            if tracked.file_id == file_id:
                tracked.parts, tracked.part_bytes = [], 0
                tracked.pending.clear()
                tracked.read_pos = tracked.batch_start = tracked.batch_end = offset
                tracked.skipping = offset > 0 and os.pread(tracked.fd, 1, offset - 1) not in (b"\n", b"\r")
                tracked.epoch = epoch
                return True
        return False

    def tracked(self) -> list[Tracked]:
        return [t for t in self.files.values() if t.file_id is not None]

    def close(self) -> None:
        for tracked in self.files.values():
            os.close(tracked.fd)
        self.files.clear()
