"""Derived data kept on disk between runs, keyed by what it was derived from.

Compiled Hyperscan databases and the maintained secret patterns are the same from one run
to the next; rebuilding them was a large part of a short command's start. Entries live under
the user's cache directory, named by a hash of their inputs, written whole or not at all;
a missing or unreadable entry means deriving it again, never an error.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
