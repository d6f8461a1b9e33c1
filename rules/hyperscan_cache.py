"""Compiled Hyperscan databases kept on disk (rules.disk_cache), keyed by what they were
compiled from.

Compiling the error guard's patterns took 0.23 s of every `faultline diagnose`, a third of
its start-up on a short log, for a result that only changes when the patterns do. The key
hashes the patterns, their flags, the Hyperscan version and the machine; anything wrong with
a stored file (missing, cut short, from another build) means compiling again.
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Sequence
from pathlib import Path

import hyperscan

from rules.disk_cache import cache_dir, store


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
    store(path, hyperscan.dumpb(db))
    return db

