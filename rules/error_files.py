"""torchrun's error files as evidence: each failing rank's exception, as the job recorded it.

With `@record` on the entry point, or TORCHELASTIC_ERROR_FILE set, a failing worker writes
`{"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack": "<traceback>",
"timestamp": "<unix seconds>"}}}` (torch/distributed/elastic/multiprocessing/errors/
error_handler.py); torchelastic's own records for a signal hold `"message"` as a string.
torchrun keeps them as `.../attempt_<n>/<local_rank>/error.json`. Their traceback is the most
precise evidence a job leaves, and the log may not hold it (a `--tee` that lost it, a box that
says `error_file: <N/A>` for another rank). Each file becomes lines of its own source, under
torchrun's own `[defaultN]:` envelope when its folder names the local rank.

Pure: the CLI (`faultline diagnose --error-file`) and the sidecar (`faultline tail
--error-files`) read the files and hand their bytes here.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import PurePath

MAX_ERROR_FILE_BYTES = 4 << 20
_RANK_DIR = re.compile(r"^\d{1,5}$")


class NotAnErrorFile(ValueError):
    """The file is not a torchrun error file, or records no exception; says which."""


def error_file_lines(raw: bytes, path: str) -> bytes:
    """An error file's bytes (read up to MAX_ERROR_FILE_BYTES + 1) as log lines: a header with
    its path and time, then the recorded traceback (or the message when there is none).
    NotAnErrorFile when it is not a torchrun error file."""
    if len(raw) > MAX_ERROR_FILE_BYTES:
        raise NotAnErrorFile(f"larger than {MAX_ERROR_FILE_BYTES >> 20} MiB, not an error file")
    try:
        data = json.loads(raw)
        outer = data["message"]
    except (ValueError, KeyError, TypeError):
        raise NotAnErrorFile("not a torchrun error file (JSON with a \"message\")") from None
    message, extra = (outer.get("message"), outer.get("extraInfo") or {}) if isinstance(outer, dict) else (outer, {})
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    stamp = extra.get("timestamp") if isinstance(extra, dict) else None
    body = str(callstack).rstrip("\n") if callstack else str(message or "")
    if not body.strip():
        raise NotAnErrorFile("records no exception")
    local_rank = _rank_of(path)
    prefix = f"[default{local_rank}]:" if local_rank is not None else ""  # as `torchrun --tee` prefixes
    header = f"torchelastic error file {path}" + (f", written {_when(stamp)}" if _when(stamp) else "")
    lines = [header, *body.splitlines()]
    return ("\n".join(prefix + line for line in lines) + "\n").encode("utf-8", "replace")


def _rank_of(path: str) -> int | None:
    parent = PurePath(path).parent.name
    return int(parent) if _RANK_DIR.match(parent) else None


def _when(stamp: object) -> str | None:
    try:
        return datetime.fromtimestamp(int(str(stamp)), UTC).isoformat()
    except (ValueError, OverflowError, OSError):
        return None
