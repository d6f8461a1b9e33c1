"""Streaming ingest: bytes in, buffers of whole lines out, with bounded memory.

Everything here is untrusted input: gzip bombs are cut by an expansion-ratio cap, binary
input is refused, a line longer than the limit is cut (its head is kept, the rest skipped
up to the next newline) so one 10 MB line cannot hold 10 MB of memory, and carriage
returns (tqdm bars, CRLF files) become line ends.
"""

from __future__ import annotations

import codecs
import ctypes
import ctypes.util
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from service.errors import BadInput, PayloadTooLarge, UnsupportedMediaType

CHUNK_BYTES = 8 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt() parameters
MAX_LINE_BYTES = 1 << 20
MAX_GZIP_RATIO = 200
"""Real logs compress 10-30x; 200x and beyond is a bomb, not a log."""
BINARY_SAMPLE = 8192
BINARY_CONTROL_SHARE = 0.05
BINARY_INVALID_SHARE = 0.3
_GZIP_MAGIC = b"\x1f\x8b"
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


@dataclass
class IngestCounters:
    bytes_in: int = 0
    """Bytes as received (compressed, if the input was)."""
    bytes_decoded: int = 0
    lines_cut: int = 0


class GzipDecoder:
    """Incremental gzip (also concatenated members) with a cap on the expansion ratio."""

    def __init__(self, max_ratio: int = MAX_GZIP_RATIO, max_output: int | None = None, *, name: str = "input"):
        self.name = name
        """Named in every error: which of the files given, or which part of an upload."""
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.max_ratio = max_ratio
        self.max_output = max_output
        self.compressed = 0
        self.consumed = 0
        """Compressed bytes the decompressor has taken: the ratio is measured against these,
        not against all that was fed (a file is read 8 MB at a time, and a bomb's first 8 MB
        would otherwise be allowed 1.6 GB of output before the check could fire)."""
        self.decompressed = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.compressed += len(data)
        while data:
            try:
                # bounded output per call keeps a bomb from expanding into memory at once
                out = self._d.decompress(data, CHUNK_BYTES)
            except zlib.error as exc:
                raise BadInput(f"{self.name}: invalid gzip data: {exc}") from None
            rest = self._d.unused_data if self._d.eof else self._d.unconsumed_tail
            self.consumed += len(data) - len(rest)
            self._account(len(out))
            if out:
                yield out
            data = self._d.unconsumed_tail
            if self._d.eof and self._d.unused_data:  # a concatenated gzip member follows
                data = self._d.unused_data
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def _account(self, produced: int) -> None:
        self.decompressed += produced
        if self.decompressed > self.max_ratio * max(self.consumed, 1024):
            raise PayloadTooLarge(
                f"{self.name}: gzip input expands more than {self.max_ratio}x: refused as a decompression bomb")
        if self.max_output is not None and self.decompressed > self.max_output:
            raise PayloadTooLarge(f"{self.name}: decompressed input exceeds the limit of {self.max_output} bytes")

    def close(self) -> None:
        if not self._d.eof and self.compressed:
            raise BadInput(f"{self.name}: truncated gzip data")


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


_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
"""Terminal escapes: colour and cursor sequences (CSI), titles and links (OSC), and the short
two-byte ones. Coloured loggers (loguru, rich, colorlog) put them around the words the rules
look for (`\x1b[31mRuntimeError: ...`): they carry no meaning for a diagnosis and are dropped
from each line, as a terminal would render it."""


def drop_escapes(data: bytes) -> bytes:
    """`data` as a terminal shows it: without its escape sequences (one memchr when it has none)."""
    return _ANSI.sub(b"", data) if b"\x1b" in data else data


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
        # on whole lines: an escape sequence never spans a newline, but may span two chunks
        return drop_escapes(whole)

    def finish(self) -> bytes:
        """The last line, when the input did not end with a newline."""
        tail, self._tail = self._tail, b""
        if not tail or self._skipping:
            return b""
        return drop_escapes(tail) + b"\n"


class LineDecoder:
    """The one way raw bytes become whole-line buffers, for a file (CLI), an upload
    (`POST /diagnose`, each multipart file) and a live append alike: gzip declared or found
    by its magic bytes (with the bomb cap), the byte limits, the binary check and the line
    splitting all live here, so every entry point refuses the same bad input the same way.

    `decode(chunk)` yields the checked, decompressed bytes (what the file holds: a live
    append checksums those); `split(piece)` turns them into whole lines; `feed` does both.
    """

    def __init__(self, *, name: str = "input", gzip: bool | None = None, max_bytes: int | None = None,
                 max_output: int | None = None, max_ratio: int = MAX_GZIP_RATIO,
                 counters: IngestCounters | None = None, transcode: bool = True):
        self.name = name
        self._transcode = transcode
        """A text that opens with a UTF-16 byte order mark (PowerShell's `>` and Windows tools
        write logs so) is read as UTF-8 from then on; off where the bytes themselves are kept
        (a live append checksums what the file holds)."""
        self._utf16: codecs.IncrementalDecoder | None = None
        self._head = b""
        """The input's first byte, held until the second says whether a BOM opens it."""
        self.counters = counters or IngestCounters()
        self._splitter = LineSplitter(counters=self.counters)
        self._gzip = gzip
        self._decoder: GzipDecoder | None = None
        self._max_bytes, self._max_output, self._max_ratio = max_bytes, max_output, max_ratio
        self._first = True

    def decode(self, chunk: bytes) -> Iterator[bytes]:
        if not chunk:
            return
        self.counters.bytes_in += len(chunk)
        if self._max_bytes is not None and self.counters.bytes_in > self._max_bytes:
            raise PayloadTooLarge(f"{self.name}: input exceeds the limit of {self._max_bytes} bytes")
        if self._first:
            self._first = False
            if self._gzip or (self._gzip is None and chunk.startswith(_GZIP_MAGIC)):
                self._decoder = GzipDecoder(max_ratio=self._max_ratio, max_output=self._max_output, name=self.name)
        for piece in self._decoder.feed(chunk) if self._decoder else (chunk,):
            if self._transcode and self.counters.bytes_decoded == 0 and self._utf16 is None:
                piece, self._head = self._head + piece, b""
                if len(piece) < 2:  # a byte order mark is two bytes: wait for the second
                    self._head = piece
                    continue
                if piece.startswith(_UTF16_BOMS):
                    self._utf16 = codecs.getincrementaldecoder("utf-16")("replace")
            if self._utf16 is not None:
                piece = self._utf16.decode(piece).encode("utf-8")
                if not piece:
                    continue
            if self.counters.bytes_decoded == 0 and looks_binary(piece):
                raise BadInput(f"{self.name}: input looks binary (NUL or control bytes), not a text log")
            self.counters.bytes_decoded += len(piece)
            if self._decoder is None and self._max_output is not None and self.counters.bytes_decoded > self._max_output:
                raise PayloadTooLarge(f"{self.name}: input exceeds the limit of {self._max_output} bytes")
            yield piece

    def split(self, piece: bytes) -> bytes:
        return self._splitter.feed(piece)

    def feed(self, chunk: bytes) -> bytes:
        """Whole lines available so far (b"" if none)."""
        out = [lines for piece in self.decode(chunk) if (lines := self._splitter.feed(piece))]
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self) -> bytes:
        """The last line (when the input did not end with a newline); checks the gzip end."""
        if self._decoder:
            self._decoder.close()
        held = b""
        if self._head:  # a one-byte input
            head, self._head = self._head, b""
            self.counters.bytes_decoded += len(head)
            held = self._splitter.feed(head)
        return held + self._splitter.finish()


def iter_line_buffers(chunks: Iterable[bytes], *, name: str = "input", gzip: bool | None = None,
                      max_bytes: int | None = None, counters: IngestCounters | None = None) -> Iterator[bytes]:
    """Whole-line buffers from raw chunks; gzip is detected from the magic bytes when None."""
    decoder = LineDecoder(name=name, gzip=gzip, max_bytes=max_bytes, counters=counters)
    for chunk in chunks:
        # one decompressed piece at a time: a file is read 8 MB at a time, and 8 MB of gzip
        # may hold gigabytes of text (memory must not grow with what a chunk expands to)
        for piece in decoder.decode(chunk):
            lines = decoder.split(piece)
            if lines:
                yield lines
    last = decoder.finish()
    if last:
        yield last


def check_content_length(value: str | None, max_bytes: int, what: str = "request body") -> None:
    """A declared Content-Length past the limit is refused before a byte is read (413); a
    malformed one is a 400. Both the upload and the live append routes ask here."""
    if value is None:
        return
    if not value.isdigit():
        raise BadInput("invalid Content-Length header")
    if int(value) > max_bytes:
        raise PayloadTooLarge(f"{what} of {value} bytes exceeds the limit of {max_bytes} bytes")


def gzip_encoded(content_encoding: str | None) -> bool:
    """Whether a request body is gzip by its Content-Encoding; 415 for any coding but these two."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding not in ("identity", "gzip", ""):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r}: send identity or gzip")
    return encoding == "gzip"


def whole_lines(body: bytes, *, name: str = "chunk") -> tuple[bytes, int]:
    """A live append's chunk as the pipeline takes it, through the same decoder: binary
    refused, CR as line ends, over-long lines cut, a final newline (the end of a chunk ends a
    line: the sidecar only sends a partial line when it gave up waiting for the rest).
    Returns the buffer and the number of the file's lines it completes: a partial line at
    the end is diagnosed as a line, but counted when the chunk that ends it comes (counted
    here too, a line sent in two parts was two lines received)."""
    decoder = LineDecoder(name=name, gzip=False)
    whole = decoder.feed(body)
    buffer = whole + decoder.finish()
    return buffer, whole.count(b"\n")
