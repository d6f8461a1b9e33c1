"""Streaming ingest: bytes in, buffers of whole lines out, with bounded memory.

Everything here is untrusted input: gzip bombs are cut by an expansion-ratio cap, binary
input is refused, a line longer than the limit is cut (its head is kept, the rest skipped
up to the next newline) so one 10 MB line cannot hold 10 MB of memory, and carriage
returns (tqdm bars, CRLF files) become line ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from service.errors import BadInput, PayloadTooLarge

CHUNK_BYTES = 8 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt() parameters
MAX_LINE_BYTES = 1 << 20
MAX_GZIP_RATIO = 200
"""Real logs compress 10-30x; 200x and beyond is a bomb, not a log."""
BINARY_SAMPLE = 8192
BINARY_CONTROL_SHARE = 0.05
BINARY_INVALID_SHARE = 0.3
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class IngestCounters:
    bytes_in: int = 0
    """Bytes as received (compressed, if the input was)."""
    bytes_decoded: int = 0
    lines_cut: int = 0


class GzipDecoder:
    """Incremental gzip (also concatenated members) with a cap on the expansion ratio."""

    def __init__(self, max_ratio: int = MAX_GZIP_RATIO, max_output: int | None = None):
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.max_ratio = max_ratio
        self.max_output = max_output
        self.compressed = 0
        self.decompressed = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.compressed += len(data)
        while data:
            try:
                # bounded output per call keeps a bomb from expanding into memory at once
                out = self._d.decompress(data, CHUNK_BYTES)
            except zlib.error as exc:
                raise BadInput(f"invalid gzip data: {exc}") from None
            self._account(len(out))
            if out:
                yield out
            data = self._d.unconsumed_tail
            if self._d.eof and self._d.unused_data:  # a concatenated gzip member follows
                data = self._d.unused_data
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def _account(self, produced: int) -> None:
        self.decompressed += produced
        if self.decompressed > self.max_ratio * max(self.compressed, 1024):
            raise PayloadTooLarge(
                f"gzip input expands more than {self.max_ratio}x: refused as a decompression bomb")
        if self.max_output is not None and self.decompressed > self.max_output:
            raise PayloadTooLarge(f"decompressed input exceeds the limit of {self.max_output} bytes")

    def close(self) -> None:
        if not self._d.eof and self.compressed:
            raise BadInput("truncated gzip data")


_CONTROL = bytes(c for c in range(32) if c not in b"\t\n\r\x0b\x0c\x08\x1b") + b"\x7f"


def reuse_freed_buffers() -> bool:
    """Have glibc hand a freed chunk buffer to the next one instead of returning it to the OS.

    Every 8 MB read and every joined line buffer is a fresh allocation; above glibc's mmap
    threshold each one arrives as new pages, zeroed by the kernel one page fault at a time
    (177,000 faults and 0.3 s of a 5.5 s filter of 1 GB, bench/filter_run.py). For one-shot
    commands only: a long-lived server would keep up to 64 MB it no longer needs.
    False where the C library is not glibc (nothing is changed there).
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 4 * CHUNK_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, 8 * CHUNK_BYTES))


def looks_binary(sample: bytes) -> bool:
    """Text logs hold few control bytes (ANSI colours and tabs aside) and decode mostly as
    UTF-8 or Latin-1 text; random or compressed data does neither."""
    head = sample[:BINARY_SAMPLE]
    if not head:
        return False
    controls = len(head) - len(head.translate(None, _CONTROL))
    if controls > BINARY_CONTROL_SHARE * len(head):
        return True
    undecodable = head.decode("utf-8", "replace").count("\ufffd")
    return undecodable > BINARY_INVALID_SHARE * len(head)


class LineSplitter:
    """Turns arbitrary byte chunks into buffers of whole lines."""

    def __init__(self, max_line: int = MAX_LINE_BYTES, counters: IngestCounters | None = None):
        self.max_line = max_line
        self.counters = counters or IngestCounters()
        self._tail = b""
        self._skipping = False  # inside the rest of an over-long line

    def feed(self, chunk: bytes) -> bytes:
        """Whole lines available so far (b"" if none)."""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                return b""
            chunk = chunk[nl + 1:]
            self._skipping = False
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            whole, self._tail = b"", self._tail + chunk
        else:
            # one copy of the chunk's whole lines (slicing then adding would copy them twice)
            whole = b"".join((self._tail, memoryview(chunk)[:cut])) if (self._tail or cut < len(chunk)) else chunk
            self._tail = chunk[cut:]
        if len(self._tail) > self.max_line:
            # keep the head of the giant line as a line of its own, drop the rest of it
            whole += self._tail[: self.max_line] + b"\n"
            self._tail = b""
            self._skipping = True
            self.counters.lines_cut += 1
        return whole

    def finish(self) -> bytes:
        """The last line, when the input did not end with a newline."""
        tail, self._tail = self._tail, b""
        return tail + b"\n" if tail and not self._skipping else b""


def iter_line_buffers(chunks: Iterable[bytes], *, gzip: bool | None = None,
                      max_bytes: int | None = None, counters: IngestCounters | None = None) -> Iterator[bytes]:
    """Whole-line buffers from raw chunks; gzip is detected from the magic bytes when None."""
    counters = counters or IngestCounters()
    splitter = LineSplitter(counters=counters)
    decoder: GzipDecoder | None = None
    first = True
    for chunk in chunks:
        if not chunk:
            continue
        counters.bytes_in += len(chunk)
        if max_bytes is not None and counters.bytes_in > max_bytes:
            raise PayloadTooLarge(f"input exceeds the limit of {max_bytes} bytes")
        if first:
            first = False
            if gzip or (gzip is None and chunk.startswith(_GZIP_MAGIC)):
                decoder = GzipDecoder(max_output=None)
        pieces = decoder.feed(chunk) if decoder else (chunk,)
        for piece in pieces:
            if counters.bytes_decoded == 0 and looks_binary(piece):
                raise BadInput("input looks binary (NUL bytes), not a text log")
            counters.bytes_decoded += len(piece)
            lines = splitter.feed(piece)
            if lines:
                yield lines
    if decoder:
        decoder.close()
    last = splitter.finish()
    if last:
        yield last
