"""An interrupt by hand: someone pressed Ctrl+C in the job's terminal.

With no error before it, a job that a person interrupted is one that sat still: people post
such a log as "it hangs here, then I pressed Ctrl+C" (a DDP run after "Reducer buckets have
been rebuilt", Megatron building its fused kernels), and the line before the interrupt is
where it sat. The marks are the terminal's echoed `^C` at the start of a line, Python's
`KeyboardInterrupt`, and torchrun's agent on SIGINT (`Received 2 death signal` / `Received
Signals.SIGINT death signal`); a SIGTERM (15) is a scheduler's, not a person's, and is not one.
Each mark is error-like (rules/packs/error_like.yaml), so only the lines the guard already
found are looked at, and the log's bytes are not read again.
"""

from __future__ import annotations

from rules.envelope import bare_message

_SIGINT_DEATH = ("Received 2 death signal", "Received Signals.SIGINT death signal")


def is_interrupt(line: str) -> bool:
    return (bare_message(line.lstrip()).startswith("^C") or "KeyboardInterrupt" in line
            or any(mark in line for mark in _SIGINT_DEATH))


def line_before(buffer: bytes, index: int) -> tuple[bytes, int] | None:
    """The last non-blank line before line `index` (0-based) of a buffer of whole lines, and
    its index; None when no such line is in the buffer."""
    lines = buffer.split(b"\n", index)[:index]
    for back, line in enumerate(reversed(lines)):
        if bare_message(line.decode("utf-8", "replace")).strip():  # stamped blank lines too
            return line.rstrip(b"\r"), index - 1 - back
    return None
