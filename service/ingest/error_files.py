"""`faultline diagnose --error-file`: torchrun's error files named by globs, read and turned
into log lines (the format: rules/error_files.py)."""

from __future__ import annotations

import glob

from rules.error_files import MAX_ERROR_FILE_BYTES, NotAnErrorFile, error_file_lines
from service.errors import BadInput


def expand(patterns: list[str]) -> list[str]:
    """The files the `--error-file` arguments name (globs expanded, in order, once each)."""
    found: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise BadInput(f"--error-file {pattern}: no file matches")
        found += [m for m in matches if m not in found]
    return found


def error_file_text(path: str) -> bytes:
    """The error file as log lines; BadInput naming the file when it cannot be read or is
    not a torchrun error file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_ERROR_FILE_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"--error-file {path}: {exc.strerror or exc}") from None
    try:
        return error_file_lines(raw, path)
    except NotAnErrorFile as exc:
        raise BadInput(f"--error-file {path}: {exc}") from None
