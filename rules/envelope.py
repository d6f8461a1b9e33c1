"""Launcher envelopes: the prefixes that launchers and collectors put in front of a message.

A training log line is often wrapped several times: `[default3]:[rank3]: RuntimeError: ...`
(torchrun's role prefix, then PyTorch's rank prefix), `12: ...` (srun --label),
`[lrdn0137:0]:` (a custom torchrun template with the host), `node-17: ` or `10.140.0.17: `
(pdsh), a collector's or logger's time stamp, containerd's `stdout F `, Determined's
`[ts] trial || `. Filter and diagnosis rules are written against the message, so the same
rule works under every launcher; this module knows the envelope, strips it and reads rank
and node out of it.

ENVELOPE_PATTERN is written in the common subset of RE2 and Python `re` syntax, because it
is compiled into every filter rule's RE2 program and also used here with `re`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One envelope component; a line may carry several in a row.
_COMPONENTS = (
    r"\[[A-Za-z_][\w.-]*:\d+\]:",          # [lrdn0137:0]:  host and local rank
    r"\[[A-Za-z_]+\d+\]: ?",                # [default3]:  [rank12]:  [trainer0]:
    r"\[\d+\] ",                            # [80746]  pid of a tee'ing wrapper
    r" *\d{1,6}: ",                         # srun --label task id
    r"[\w.]+/\d+ ",                         # nemo-run: i.pretrain/0
    # pdsh / k8s host: rdma-test-gpu-worker-1:  (no underscore: a host name has none, and
    # `flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol` is a file)
    r"[A-Za-z][A-Za-z0-9.]*(?:-[A-Za-z0-9.]+)+: ",
    r"\d{1,3}(?:\.\d{1,3}){3}: ",            # pdsh by address (DeepSpeed's runner): 10.140.0.17:
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? ",  # collector stamp (RFC 3339)
    r"(?:stdout|stderr) [FP] ",               # containerd's log files: <stamp> stdout F <line>
    r"\[\d{4}-\d\d-\d\dT[\d:.]+Z\] [0-9a-f]{8} \|\| ",                   # Determined AI
)

_STAMP = (r"(?:\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"
          r"|\[\d\d:\d\d:\d\d(?:[.,]\d+)?\]) +")
"""A logger's or collector's time stamp in front of the message (`2025-01-06 12:05:35,123 `,
`[2025-01-06 12:05:35] `, moreutils' `ts` and rich's `[12:05:35] `). Rules are written with
it where their framework prints it (DeepSpeed's, torchtitan's and fairseq's lines start with
one), so split_envelope leaves it in the message; but a rule's program may find it in front
(ENVELOPE_PATTERN: a match tries both readings), so a collector that stamps every line hides
no rule."""

ENVELOPE_PATTERN = "(?:" + "|".join((*_COMPONENTS, _STAMP)) + ")*"

_ENVELOPE_RE = re.compile("(?:" + "|".join(_COMPONENTS) + ")*")
_LOGGER_STAMP = re.compile(_STAMP)
_ROLE_RE = re.compile(r"\[([A-Za-z_]+)(\d+)\]:")
_HOST_RANK_RE = re.compile(r"\[([A-Za-z_][\w.-]*):(\d+)\]:")
_SRUN_RE = re.compile(r"^ *(\d{1,6}): ")
_HOST_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9.]*(?:-[A-Za-z0-9.]+)+|\d{1,3}(?:\.\d{1,3}){3}): ")


@dataclass(frozen=True, slots=True)
class Envelope:
    message: str
    """The line without its launcher prefixes."""
    rank: int | None = None
    """Global rank, when a prefix says it ([rankN]:, srun's task id)."""
    local_rank: int | None = None
    node: str | None = None


def split_envelope(line: str) -> Envelope:
    """Strip the launcher prefixes from a line and read rank, local rank and node from them."""
    m = _ENVELOPE_RE.match(line)
    if m is None or m.end() == 0:
        return Envelope(message=line)
    prefix = line[: m.end()]
    rank = local_rank = None
    node = None
    for role, num in _ROLE_RE.findall(prefix):
        if role == "rank":
            rank = int(num)
        else:
            local_rank = int(num)
    hm = _HOST_RANK_RE.search(prefix)
    if hm:
        node, local_rank = hm.group(1), int(hm.group(2))
    sm = _SRUN_RE.match(prefix)
    if sm and rank is None:
        rank = int(sm.group(1))
    if node is None:
        host = _HOST_RE.search(prefix)
        if host:
            node = host.group(1)
    return Envelope(message=line[m.end():], rank=rank, local_rank=local_rank, node=node)


def without_stamp(message: str) -> str:
    """A message without a leading logger's time stamp (and any envelope after it)."""
    if message[:1].isdigit() or message[:1] == "[":
        m = _LOGGER_STAMP.match(message)
        if m:
            return split_envelope(message[m.end():]).message
    return message


def bare_message(line: str) -> str:
    """The message without envelope and without a leading time stamp: where the shape of a
    line is judged (a traceback frame, an exception line, a blank line, a `^C`), which a
    stamp in front must not hide, whoever put it there."""
    return without_stamp(split_envelope(line).message)
