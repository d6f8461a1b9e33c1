"""Job families: the name of a job with its run ids and dates taken out, so a resubmitted
job (`llama-70b-pretrain-20241103-7f3a9c`, then `...-20241104-b21e07`) finds the rules
learned on its earlier runs."""

from __future__ import annotations

import re

_VOLATILE = [
    # dates and date-times; a time must end there, or `20241104-2265b1` would lose `-2265`
    # to the time and leave `b1` of the run id behind
    re.compile(r"\d{4}-?\d\d-?\d\d(?:[t -]?\d\d:?\d\d(?::?\d\d)?(?![0-9a-z]))?"),
    re.compile(r"\b[0-9a-f]{6,}\b"),                                     # hex run ids, hashes
    re.compile(r"(?<![.\d])\b(?:run|job|attempt|try|retry|r|v)?\d+\b(?![.\d])"),  # counters: run3, 0042
]
_SEPARATORS = re.compile(r"[-_.:/ ]+")


def job_family(name: str) -> str:
    """`llama-70b-pretrain-20241103-7f3a9c` -> `llama-70b-pretrain`; '' when nothing is left."""
    text = name.strip().lower().replace("_", "-")
    for pattern in _VOLATILE:
        text = pattern.sub(" ", text)
    return "-".join(part for part in _SEPARATORS.split(text) if part)
