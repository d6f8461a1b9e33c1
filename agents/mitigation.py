"""Mitigation text that names what to do: the nodes to cordon, the setting to change, the
file that is missing, the module to install, the address to check.

Facts are read from the root-cause line and the lines that repeat it (`Facts.read`); the
text is the reason's action with those facts filled in, then the taxonomy's general advice.
Pure: strings in, a string out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rules.taxonomy import Origin, reason

_PATH = re.compile(r"(?<![\w/.~-])(?:[A-Za-z][\w+.-]*://|~?/)[^\s'\",;()\[\]{}<>|`]+")
_ADDRESS = re.compile(r"(?:\[?(?P<host>[A-Za-z][\w.-]*|\d{1,3}(?:\.\d{1,3}){3})\]?[:<](?P<port>\d{2,5})\b)")
_ENV_SETTING = re.compile(r"\b(?P<name>(?:NCCL|TORCH|PYTORCH|CUDA|HF|XLA|TF|OMP|FI|NVTE)_[A-Z0-9_]+)(?:=(?P<value>[^\s,;]+))?")
_FLAG = re.compile(r"(?<![\w-])(?P<flag>--?[A-Za-z][\w.-]*)(?:[= ](?P<value>[^\s,;'\"]+))?")
_OVERRIDE = re.compile(r"(?:override|flag|option|argument|key)\s+'(?P<name>[\w.+/-]+)'", re.IGNORECASE)
_MODULE = re.compile(r"(?:module named|import name|lookup error: |undefined symbol: )\s*'?(?P<name>[\w./-]+)'?")
_QUOTED_KEY = re.compile(r"[Kk]ey '(?P<key>[\w.-]+)'")
_SIZE = re.compile(r"(?P<amount>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B|bytes)\b")


@dataclass(frozen=True)
class Facts:
    """What a mitigation can name, read from the failure's lines."""

    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    paths: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    sizes: tuple[str, ...] = ()
    last_checkpoint_step: int | None = None

    @classmethod
    def read(cls, lines: Sequence[str], *, nodes: Iterable[str] = (), ranks: Iterable[int] = (),
             last_checkpoint_step: int | None = None) -> Facts:
        def unique(items: Iterable[str], limit: int = 4) -> tuple[str, ...]:
            out: list[str] = []
            for item in items:
                item = item.rstrip(".:'\")]")
                if item and item not in out:
                    out.append(item)
            return tuple(out[:limit])

        text = lines[:8]
        return cls(
            nodes=unique(nodes, 8), ranks=tuple(sorted(set(ranks)))[:16],
            paths=unique(m.group(0) for line in text for m in _PATH.finditer(line)
                         if not m.group(0).startswith(("http://", "https://")) or "://" not in m.group(0)[:8]),
            addresses=unique(f"{m.group('host')}:{m.group('port')}" for line in text for m in _ADDRESS.finditer(line)),
            settings=unique((m.group("name") + (f"={m.group('value')}" if m.group("value") else ""))
                            for line in text for m in _ENV_SETTING.finditer(line)),
            flags=unique([*(m.group("name") for line in text for m in _OVERRIDE.finditer(line)),
                          *(m.group("flag") for line in text for m in _FLAG.finditer(line) if len(m.group("flag")) > 3)]),
            modules=unique(m.group("name") for line in text for m in _MODULE.finditer(line)),
            keys=unique(m.group("key") for line in text for m in _QUOTED_KEY.finditer(line)),
            sizes=unique(m.group(0) for line in text for m in _SIZE.finditer(line)),
            last_checkpoint_step=last_checkpoint_step,
        )


def _join(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else (items[0] if items else "")


@dataclass
class _Text:
    parts: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if text:
            self.parts.append(text.rstrip(". ") + ".")


def _restart(facts: Facts) -> str:
    if facts.last_checkpoint_step is not None:
        return f"restart from the checkpoint of step {facts.last_checkpoint_step}"
    return "restart from the last checkpoint"


def mitigation_for(reason_id: str, origin: str, facts: Facts) -> str:
    """What to do, with the facts named; the taxonomy's advice closes the text."""
    entry = reason(reason_id)
    out = _Text()
    where = _join(list(facts.nodes))
    ranks = f" (rank{'s' if len(facts.ranks) > 1 else ''} {_join([str(r) for r in facts.ranks[:6]])})" if facts.ranks else ""
    if origin == Origin.INFRASTRUCTURE.value:
        if reason_id in ("connection_error",):
            target = _join(list(facts.addresses)) or "the master address and port"
            out.add(f"Check that {target} is reachable from every node{(' (' + where + ' failed to connect)') if where else ''}, "
                    f"then {_restart(facts)}")
        elif reason_id == "s3_storage_error":
            target = _join(list(facts.paths)) or "the storage endpoint"
            out.add(f"Check {target} and its credentials; {_restart(facts)} once the storage answers again")
        elif where and entry.action.value == "cordon_and_restart":
            out.add(f"Cordon {where}{ranks}: it reported the failure; run its health checks, then {_restart(facts)} "
                    "on healthy nodes")
        elif where:
            out.add(f"The failure was first reported on {where}{ranks}; if it repeats there, cordon it; {_restart(facts)}")
        else:
            out.add(f"Find the node behind the failing rank{ranks or ''}, cordon it if its checks fail, {_restart(facts)}")
    elif reason_id in ("file_not_found_error", "model_loading_error", "dataset_loading_error", "permission_error"):
        if facts.paths:
            verb = {"permission_error": "is not accessible to the job", "file_not_found_error": "is missing"}.get(
                reason_id, "could not be loaded")
            out.add(f"{_join(list(facts.paths))} {verb}: fix the path in the config or command line, create it, "
                    "or mount the volume it lives on")
    elif reason_id == "out_of_memory":
        asked = f" (it asked for {facts.sizes[0]})" if facts.sizes else ""
        out.add(f"The device ran out of memory{asked}: lower the micro-batch size or sequence length, enable activation "
                "checkpointing or more model parallelism"
                + (f"; {facts.settings[0]} is set in the log" if facts.settings else ""))
    elif reason_id == "import_error" and facts.modules:
        out.add(f"Install or rebuild {_join(list(facts.modules))} against the framework version in the job's image")
    elif reason_id in ("argument_error", "value_error", "attribute_error", "key_error") and (facts.flags or facts.keys):
        names = _join(list(facts.keys or facts.flags))
        out.add(f"Change the setting {names}: it is unknown, missing or invalid for this code version")
    elif reason_id == "os_error" and facts.paths:
        out.add(f"Free space or quota on the volume of {facts.paths[0]}, or raise the limit the error names")
    elif reason_id == "job_cancelled":
        out.add(f"The scheduler stopped the job; resubmit and {_restart(facts)}, with a longer time limit or an earlier save")
    if facts.settings and reason_id != "out_of_memory":
        out.add(f"Settings named in the log: {_join(list(facts.settings))}")
    out.add(entry.mitigation)
    return " ".join(out.parts)


MAX_ADVICE_CHARS = 400
_URL = re.compile(r"(?i)\b(?:https?|ftp)://\S+")
_MARKUP = re.compile(r"<[^>]{0,200}>|```|`|\*\*|__|^#+\s*|^\s*[-*]\s+", re.MULTILINE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRAIN = re.compile(r"(?i)\b(?:cordon|drain|scontrol|kubectl|reboot|power[- ]?cycle|replace the node)\b")


def plain_advice(text: str, *, may_drain: bool) -> str:
    """A model's advice as a mitigation may hold it: plain text (no markup, no links, no
    control characters), at most MAX_ADVICE_CHARS cut at a sentence end, and no advice to
    drain or reboot a node unless the diagnosis itself may (`may_drain`); what a log line
    made the model say is never an instruction to the scheduler's hook."""
    text = _CONTROL.sub(" ", text or "")
    text = _URL.sub("[link removed]", text)
    text = " ".join(_MARKUP.sub(" ", text).split())
    if not may_drain and _DRAIN.search(text):
        return ""
    if len(text) > MAX_ADVICE_CHARS:
        cut = text[:MAX_ADVICE_CHARS]
        end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
        text = cut[:end + 1] if end > MAX_ADVICE_CHARS // 2 else cut.rstrip() + "..."
    return text
