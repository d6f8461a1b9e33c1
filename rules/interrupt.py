"""An interrupt by hand: someone pressed Ctrl+C in the job's terminal.

With no error before it, a job that a person interrupted is one that sat still: people post
such a log as "it hangs here, then I pressed Ctrl+C" (a DDP run after "Reducer buckets have
been rebuilt", Megatron building its fused kernels), and the line before the interrupt is
where it sat. The marks are the terminal's echoed `^C`, Python's `KeyboardInterrupt`, and
torchrun's agent on SIGINT (`Received 2 death signal` / `Received Signals.SIGINT death
signal`); a SIGTERM (15) is a scheduler's, not a person's, and is not one.

Found with `bytes.find` on the raw buffer (memchr speed, ahead of the filter), until the
first one.
"""

from __future__ import annotations

_DEATH = b" death signal"
_SIGINT_DEATH = (b"Received 2", b"Received Signals.SIGINT")
_MARKS = (b"^C", b"KeyboardInterrupt", _DEATH)


def _line_start(buffer: bytes, at: int) -> int:
    return buffer.rfind(b"\n", 0, at) + 1


def _is_interrupt(buffer: bytes, mark: bytes, at: int) -> bool:
    start = _line_start(buffer, at)
    if mark == b"^C":
        return at == start  # echoed at the start of a line ("^CTraceback ...", "^C")
    if mark == _DEATH:
        return any(buffer.endswith(signal, start, at) for signal in _SIGINT_DEATH)
    return True


def _first(buffer: bytes) -> int:
    """Offset of the first interrupt mark in the buffer, or -1."""
    first = -1
    for mark in _MARKS:
        at = buffer.find(mark)
        while at >= 0 and not _is_interrupt(buffer, mark, at):
            at = buffer.find(mark, at + len(mark))
        if at >= 0 and (first < 0 or at < first):
            first = at
    return first


def find_interrupt(buffer: bytes) -> tuple[bytes | None, int] | None:
    """The last non-blank line before the first interrupt in a buffer of whole lines, and
    its index (0-based line of the buffer); (None, 0) when no line of the buffer precedes
    the interrupt; None when the buffer holds no interrupt."""
    at = _first(buffer)
    if at < 0:
        return None
    end = _line_start(buffer, at)
    while end > 0:
        start = _line_start(buffer, end - 1)
        line = buffer[start:end - 1].rstrip(b"\r")
        if line.strip():
            return line, buffer.count(b"\n", 0, start)
        end = start
    return None, 0
