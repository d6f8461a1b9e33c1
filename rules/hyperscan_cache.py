"""Compiled Hyperscan databases kept on disk, keyed by what they were compiled from.

Compiling the error guard's patterns took 0.23 s of every `faultline diagnose`, a third of
its start-up on a short log, for a result that only changes when the patterns do. The
serialized database is stored under the user's cache directory, named by a hash of the
patterns, their flags, the Hyperscan version and the machine; anything wrong with a stored
file (missing, cut short, from another build) means compiling again, never an error.
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

import hyperscan


def cache_dir() -> Path:
    """FAULTLINE_CACHE_DIR, else $XDG_CACHE_HOME/faultline, else ~/.cache/faultline."""
    explicit = os.environ.get("FAULTLINE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "faultline"


def _key(expressions: Sequence[bytes], flags: Sequence[int]) -> str:
    digest = hashlib.sha256()
    for part in (hyperscan.__version__, platform.machine(), platform.python_implementation()):
        digest.update(part.encode() + b"\0")
    for expression, flag in zip(expressions, flags, strict=True):
        digest.update(b"%d\0%s\0" % (flag, expression))
    return digest.hexdigest()[:32]


def compile_database(expressions: Sequence[bytes], flags: Sequence[int]) -> hyperscan.Database:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=list(expressions), ids=list(range(len(expressions))),
               elements=len(expressions), flags=list(flags))
    return db


def database(expressions: Sequence[bytes], flags: Sequence[int], *, where: Path | None = None) -> hyperscan.Database:
    """The block-mode database of `expressions` (ids 0..n-1), from the cache when it holds it."""
    path = (where or cache_dir()) / f"hyperscan-{_key(expressions, flags)}.db"
    try:
        return hyperscan.loadb(path.read_bytes(), hyperscan.HS_MODE_BLOCK)
    except (OSError, hyperscan.error):
        pass
    db = compile_database(expressions, flags)
    _store(path, hyperscan.dumpb(db))
    return db


def _store(path: Path, data: bytes) -> None:
    """Write whole or not at all: a reader sees the old file or the new one, never half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".hyperscan-")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: compile each time, as before the cache
