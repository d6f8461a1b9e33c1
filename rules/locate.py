"""Where a line came from: the rank and node that printed it, read from envelope and message."""

from __future__ import annotations

import re

from rules.envelope import Envelope

# Each pattern names the rank and/or node groups it can read; tried in order, first wins.
_RANK_NODE = [
    # NCCL's own prefix, `host:pid:tid [dev]`, with the source location newer NCCL puts
    # before the level (`[4] ib_plugin.c:1615 NCCL WARN`), a path inside NCCL's tree for its
    # own files (`[2] transport/nvls.cc:244 NCCL WARN`, `misc/ibvwrap.cc:284`)
    re.compile(r"^(?P<node>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?NCCL"),
    re.compile(r"\bRank (?P<rank>\d+), node (?P<node>[\w.-]+), device"),         # Megatron rerun machine
    re.compile(r"srun: error: (?P<node>[\w.-]+): tasks? (?P<rank>\d+)"),         # srun task summary
    re.compile(r"\*\*\* (?:JOB|STEP) [\d.]+ ON (?P<node>[\w.-]+) CANCELLED"),   # slurmstepd
    re.compile(r"^\w{3} +\d+ [\d:]+ (?P<node>[\w.-]+) kernel:"),                 # syslog (dmesg via journald)
    re.compile(r"^\s*host\s*: (?P<node>[\w.-]+)\s*$"),                          # torchrun failure box
    re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\]"),                       # [Rank 3], [PG 0 Rank 3]
    re.compile(r"\bon rank:? (?P<rank>\d+)"),
]


def locate(envelope: Envelope, default_node: str | None = None) -> tuple[int | None, str | None]:
    """(rank, node) of a line; the envelope wins, then the message, then the default node."""
    rank, node = envelope.rank, envelope.node
    if rank is None or node is None:
        for pattern in _RANK_NODE:
            m = pattern.search(envelope.message)
            if m is None:
                continue
            found = m.groupdict()
            if rank is None and found.get("rank") is not None:
                rank = int(found["rank"])
            if node is None and found.get("node") is not None:
                node = found["node"]
            break
    return rank, node or default_node
