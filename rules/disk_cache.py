"""Derived data kept on disk between runs, keyed by what it was derived from.

Compiled Hyperscan databases, the maintained secret patterns and the parsed rule packs are
the same from one run to the next; rebuilding them was a large part of a short command's
start. Entries live under
the user's cache directory, named by a hash of their inputs, written whole or not at all;
a missing or unreadable entry means deriving it again, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """FAULTLINE_CACHE_DIR, else $XDG_CACHE_HOME/faultline, else ~/.cache/faultline."""
    explicit = os.environ.get("FAULTLINE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "faultline"


def store(path: Path, data: bytes) -> None:
    """Write whole or not at all: a reader sees the old file or the new one, never half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: derive it each time


def derived_json(name: str, inputs: Sequence[Path], derive: Callable[[], Any]) -> Any:
    """`derive()`'s JSON-able result, kept under `name` and a hash of the inputs' bytes (the
    data files and the code that reads them). JSON, not pickle: a file in a cache directory
    is never a program. An entry that is missing or unreadable is derived again; an error of
    `derive` (a malformed pack) is raised as it is and nothing is kept."""
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(str(path.name).encode() + b"\0" + path.read_bytes() + b"\0")
    entry = cache_dir() / f"{name}-{digest.hexdigest()[:32]}.json"
    try:
        return json.loads(entry.read_bytes())
    except (OSError, ValueError):
        pass
    value = derive()
    store(entry, json.dumps(value, separators=(",", ":")).encode())
    return value
