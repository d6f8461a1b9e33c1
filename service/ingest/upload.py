"""Streaming request bodies into a job: plain text, gzip, or multipart with several files.

The body is never held whole: chunks from the server are decoded, split into whole lines
and handed to the job in buffers of a few MB (one filter call per buffer keeps the block
acceleration effective), with a byte limit checked as the bytes arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header

from service.errors import BadInput, PayloadTooLarge
from service.ingest.lines import LineDecoder
from service.threads import in_turn
from rules.job import JobRun

FEED_BYTES = 4 << 20
MAX_FILES = 10_000
"""Files in one multipart upload: one per rank of a 10,000-GPU job. More is not a job's log
set, and each file costs a stream and its state."""


class _SourceFeeder:
    """Decodes one source's bytes and feeds the job in large buffers."""

    def __init__(self, run: JobRun, name: str, *, gzip: bool | None, max_ratio: int, decoded: _Limit):
        self.run, self.name = run, name
        self.decoder = LineDecoder(name=name, gzip=gzip, max_ratio=max_ratio)
        self.counters = self.decoder.counters
        self.decoded = decoded
        """The request's limit, on what its bodies decompress to (shared by its files)."""
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, data: bytes) -> bool:
        """Take raw bytes; True when enough whole lines are pending to feed."""
        before = self.counters.bytes_decoded
        lines = self.decoder.feed(data)
        self.decoded.add(self.counters.bytes_decoded - before)
        if lines:
            self.pending.append(lines)
            self.pending_bytes += len(lines)
        return self.pending_bytes >= FEED_BYTES

    def flush(self) -> None:
        """Feed what is pending (runs in a worker thread: filtering is CPU work)."""
        if self.pending:
            buffer = b"".join(self.pending)
            self.pending, self.pending_bytes = [], 0
            self.run.feed(self.name, buffer, raw_bytes=0)

    def finish(self) -> None:
        last = self.decoder.finish()
        if last:
            self.pending.append(last)
        self.flush()
        self.run.bytes_in += self.counters.bytes_in
        self.run.lines_cut += self.counters.lines_cut


class _Limit:
    def __init__(self, max_bytes: int, what: str = "request body"):
        self.max_bytes, self.seen, self.what = max_bytes, 0, what

    def add(self, n: int) -> None:
        self.seen += n
        if self.seen > self.max_bytes:
            raise PayloadTooLarge(f"{self.what} exceeds the limit of {self.max_bytes} bytes")


def _decoded_limit(max_bytes: int) -> _Limit:
    """The body limit applies to what a gzip body holds, too: an 11 MB gzip of 300 MB of
    text is a 300 MB upload (the expansion ratio alone allows up to 200x the limit)."""
    return _Limit(max_bytes, "decompressed request body")


async def feed_plain(run: JobRun, body: AsyncIterator[bytes], *, name: str, gzip: bool,
                     max_bytes: int, max_ratio: int, cpu: asyncio.Semaphore | None = None) -> None:
    """`cpu`: the process's slots for CPU work (service.threads.in_turn)."""
    feeder = _SourceFeeder(run, name, gzip=gzip, max_ratio=max_ratio, decoded=_decoded_limit(max_bytes))
    limit = _Limit(max_bytes)
    async for chunk in body:
        limit.add(len(chunk))
        if feeder.add(chunk):
            await in_turn(cpu, feeder.flush)
    await in_turn(cpu, feeder.finish)


async def feed_multipart(run: JobRun, body: AsyncIterator[bytes], content_type: str, *,
                         max_bytes: int, max_ratio: int, max_files: int = MAX_FILES,
                         cpu: asyncio.Semaphore | None = None) -> int:
    """Each file part is a source of the job; returns the number of files."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadInput("multipart body without a boundary")
    state = _MultipartState(run, max_ratio, _decoded_limit(max_bytes), max_files)
    parser = MultipartParser(boundary, state.callbacks())
    limit = _Limit(max_bytes)
    async for chunk in body:
        limit.add(len(chunk))
        _write(parser, chunk)
        for feeder in state.take_ready():
            await in_turn(cpu, feeder.flush)
        for feeder in state.take_finished():
            await in_turn(cpu, feeder.finish)
    _write(parser, None)
    for feeder in state.take_finished():
        await in_turn(cpu, feeder.finish)
    if not state.files:
        raise BadInput("multipart body holds no file part")
    return state.files


def _write(parser: MultipartParser, chunk: bytes | None) -> None:
    """One chunk into the parser (None: the end); a malformed part (a control character in a
    part's header, a broken boundary) is the client's error, 400, never a 500."""
    try:
        if chunk is None:
            parser.finalize()
        else:
            parser.write(chunk)
    except MultipartParseError as exc:
        raise BadInput(f"malformed multipart body: {exc}") from None


class _MultipartState:
    def __init__(self, run: JobRun, max_ratio: int, decoded: _Limit, max_files: int = MAX_FILES):
        self.run, self.max_ratio, self.max_files, self.decoded = run, max_ratio, max_files, decoded
        self.files = 0
        self._header_field = b""
        self._in_value = False
        self._headers: dict[bytes, bytes] = {}
        self._current: _SourceFeeder | None = None
        self._ready: list[_SourceFeeder] = []
        self._finished: list[_SourceFeeder] = []

    def callbacks(self) -> dict[str, Callable]:
        return {
            "on_part_begin": self._begin, "on_header_field": self._field, "on_header_value": self._value,
            "on_headers_finished": self._headers_done, "on_part_data": self._data, "on_part_end": self._end,
        }

    def _begin(self) -> None:
        self._headers, self._current = {}, None
        self._header_field, self._in_value = b"", False

    def _field(self, data: bytes, start: int, end: int) -> None:
        # a header name may arrive in pieces (a read boundary inside it): the pieces join
        # until its value starts; a name after a value is the next header's
        piece = data[start:end].lower()
        self._header_field = piece if self._in_value else self._header_field + piece
        self._in_value = False

    def _value(self, data: bytes, start: int, end: int) -> None:
        self._in_value = True
        self._headers[self._header_field] = self._headers.get(self._header_field, b"") + data[start:end]

    def _headers_done(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        filename = params.get(b"filename")
        if filename is None:
            return  # a plain form field, not a log
        self.files += 1
        if self.files > self.max_files:
            raise PayloadTooLarge(f"more than {self.max_files} files in one upload: send one job's logs "
                                  "(or join the small files first)")
        name = filename.decode("utf-8", "replace") or f"part-{self.files}"
        gzip = name.endswith(".gz") or self._headers.get(b"content-encoding", b"").strip().lower() == b"gzip"
        self._current = _SourceFeeder(self.run, name, gzip=gzip or None, max_ratio=self.max_ratio,
                                      decoded=self.decoded)

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._current is not None and self._current.add(data[start:end]) and self._current not in self._ready:
            self._ready.append(self._current)

    def _end(self) -> None:
        if self._current is not None:
            self._finished.append(self._current)
            self._current = None

    def take_ready(self) -> list[_SourceFeeder]:
        ready, self._ready = self._ready, []
        return ready

    def take_finished(self) -> list[_SourceFeeder]:
        done, self._finished = self._finished, []
        return done
