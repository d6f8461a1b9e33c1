"""Log records from the shippers people already run: Fluent Bit's `http` output and Vector's
`http` sink, each reading files with its own tail input.

A record is one line of one file with the byte offset where the line starts in that file:
Fluent Bit's tail input adds it under `Offset_Key`, Vector's file source under `offset_key`;
the file's path comes under Fluent Bit's `Path_Key` or Vector's `file` field; the text under
`log` (Fluent Bit) or `message` (Vector). The body is JSON lines (Fluent Bit `Format
json_lines`, Vector `framing.method = "newline_delimited"`) or one JSON array (Fluent Bit
`Format json`, Vector's json codec without framing).

The records of each file become one batch of consecutive lines, which the live-job ledger
takes like a sidecar's chunk: the offsets are what makes a shipper's retry count once.
Pure: bytes in, batches out; nothing here touches the database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from service.errors import BadInput

TEXT_FIELDS = ("log", "message")
FILE_FIELDS = ("filename", "file", "path")
OFFSET_FIELD = "offset"
MAX_SOURCE_CHARS = 512


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive lines of one file, in the order of their offsets."""

    source: str
    offsets: tuple[int, ...]
    """Where each line starts in the file: a replay is cut at a line, never inside one."""
    texts: tuple[bytes, ...]
    """Each record's text (a shipper's multiline parser may have joined several lines)."""

    @property
    def offset(self) -> int:
        return self.offsets[0]

    @property
    def end(self) -> int:
        """The byte after the last line's newline, as far as its text tells (a shipper drops a
        CR before the newline, so the file's next line may start a byte later)."""
        return self.offsets[-1] + len(self.texts[-1]) + 1

    @property
    def body(self) -> bytes:
        return b"".join(text + b"\n" for text in self.texts)

    def since(self, offset: int) -> Batch | None:
        """The lines that start at or after `offset`, or None when there are none."""
        keep = next((i for i, at in enumerate(self.offsets) if at >= offset), None)
        if keep is None:
            return None
        return self if keep == 0 else Batch(self.source, self.offsets[keep:], self.texts[keep:])


def parse(body: bytes, *, max_records: int) -> list[Batch]:
    """The batches of a shipper's request body, one per file, in the order files first appear.

    Raises BadInput naming the first record that is not a line of a file with its offset (the
    shipper's config lacks the offset or path key), or a body that is not JSON records."""
    records = _records(body, max_records)
    by_file: dict[str, list[tuple[int, bytes]]] = {}
    for index, record in enumerate(records):
        source, offset, text = _fields(record, index)
        by_file.setdefault(source, []).append((offset, text))
    return [_batch(source, lines) for source, lines in by_file.items()]


def _records(body: bytes, max_records: int) -> list[object]:
    stripped = body.strip()
    if not stripped:
        raise BadInput("no records: the body is empty")
    try:
        if stripped.startswith(b"["):
            records = json.loads(stripped)
        else:
            records = [json.loads(line) for line in stripped.splitlines() if line.strip()]
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"the body is not JSON records (JSON lines or one array): {exc}") from None
    if not isinstance(records, list):
        raise BadInput("the body must be JSON lines or a JSON array of records")
    if len(records) > max_records:
        raise BadInput(f"{len(records)} records in one request, more than {max_records}: send smaller batches")
    return records


def _fields(record: object, index: int) -> tuple[str, int, bytes]:
    if not isinstance(record, dict):
        raise BadInput(f"record {index} is not a JSON object")
    text = next((record[k] for k in TEXT_FIELDS if isinstance(record.get(k), str)), None)
    source = next((record[k] for k in FILE_FIELDS if isinstance(record.get(k), str) and record[k]), None)
    offset = record.get(OFFSET_FIELD)
    if text is None:
        raise BadInput(f"record {index} has no line text under {' or '.join(TEXT_FIELDS)}")
    if source is None:
        raise BadInput(f"record {index} names no file under {' or '.join(FILE_FIELDS)}: set Fluent Bit's "
                       "`Path_Key filename` (Vector's file source adds `file` itself)")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise BadInput(f"record {index} has no byte offset under {OFFSET_FIELD!r}: set Fluent Bit's "
                       "`Offset_Key offset` or Vector's `offset_key = \"offset\"` (without it a retry would "
                       "count twice)")
    if len(source) > MAX_SOURCE_CHARS:
        raise BadInput(f"record {index}: the file name is longer than {MAX_SOURCE_CHARS} characters")
    return source, offset, text.encode("utf-8", "surrogatepass").rstrip(b"\r\n")


def _batch(source: str, lines: list[tuple[int, bytes]]) -> Batch:
    lines.sort(key=lambda line: line[0])
    # the same offset twice in one request is one line sent twice
    unique = [line for i, line in enumerate(lines) if i == 0 or line[0] != lines[i - 1][0]]
    return Batch(source, tuple(offset for offset, _ in unique), tuple(text for _, text in unique))
