"""The embedded miner: log templates found by Drain, turned into anchored, typed regexes.

Why Drain (logpai/Drain3): it is a small, well-kept streaming miner with a pure core
(`drain3.drain.Drain`) that clusters lines by token count and shared tokens in bounded time.
We use only that core, not its TemplateMiner facade, because we need two things the facade
does not give: the member lines of each cluster (to build a regex that matches them, with
their real whitespace) and typed variables (a number is not a host is not a path).

How a line becomes a regex:

1. **Masking.** Values that change from line to line or run to run (time stamps, dates,
   IP addresses, paths and URLs, host names, hex ids, mixed letter-digit ids, numbers) are replaced by
   typed placeholders *before* mining, so that `completed step: 9` and `completed step: 10`
   are the same template, and a rule learned on one run still matches the next run's dates
   and hosts.
2. **Mining.** Drain clusters the masked lines; where members differ it puts a wildcard.
3. **Regex.** Each template token becomes a regex piece: literals escaped, placeholders
   turned into their type's regex, Drain wildcards typed by the narrowest class that fits
   every member's value. Whitespace runs become ` +`, so padded columns still match.
   Numbers after a known key (`step`, `loss`, `grad_norm`, `lr`, `seconds`, ...) become
   named progress captures, so the compressed log still tells how far the job got.

Nothing produced here can match a newline (no `\\s`, no `.`, negated classes exclude
whitespace): a learned rule always covers exactly one line.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from collections.abc import Sequence
from dataclasses import dataclass

from rules.envelope import split_envelope

# Placeholder markers from the Unicode private use area: they never occur in log text.
_OPEN, _CLOSE, _WILD, _LEAD = "\ue000", "\ue001", "\ue002", "\ue003"


@dataclass(frozen=True, slots=True)
class VarType:
    name: str
    find: str
    """Python `re` pattern that finds the value in a line (may use look-around)."""
    out: str
    """Regex emitted for it: the common subset of RE2 and Python syntax, line-bounded."""


_NUM_OUT = r"[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
# Order matters: the first type that matches at a position wins.
VAR_TYPES: tuple[VarType, ...] = (
    # no type may match whitespace: a message is masked in one pass, then split into tokens
    VarType("ts", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?",
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"),
    VarType("date", r"\d{4}[-/]\d\d[-/]\d\d", r"\d{4}[-/]\d\d[-/]\d\d"),
    VarType("time", r"\d\d:\d\d:\d\d(?:[.,]\d+)?", r"\d\d:\d\d:\d\d(?:[.,]\d+)?"),
    VarType("ip", r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\w.])",
            r"\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?"),
    VarType("path", r"(?<![\w/.~-])(?:[A-Za-z][\w+.-]*://|~?/)[^\s'\",;()\[\]{}<>|]+",
            r"(?:[A-Za-z][\w+.-]*://|~?/)[^\s'\",;()\[\]{}<>|]+"),
    VarType("host", r"(?<![\w.-])(?=[a-z][a-z0-9-]*\d)[a-z][a-z0-9]*(?:-[a-z0-9]+)+(?![\w.-])",
            r"[A-Za-z][\w.-]*"),
    VarType("hex", r"(?<![\w])(?:0x[0-9a-fA-F]+|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{6,})(?![\w])",
            r"(?:0x)?[0-9a-fA-F]+"),
    VarType("id", r"(?<![A-Za-z0-9])(?=[a-z0-9]*\d)(?=[a-z0-9]*[a-z])[a-z0-9]{5,}(?![A-Za-z0-9])",
            r"[A-Za-z0-9]+"),
    VarType("num", r"(?:(?<=[\s=:(\[,])[+-])?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", _NUM_OUT),
)
_TYPES = {t.name: t for t in VAR_TYPES}
_MASK_RE = re.compile("|".join(f"(?P<{t.name}>{t.find})" for t in VAR_TYPES))
_PLACEHOLDER_RE = re.compile(f"{_OPEN}(\\w+){_CLOSE}")

# Classes for Drain wildcards, narrowest first: (name, regex); the first that fully matches
# every member's value is used.
_WILDCARD_CLASSES: tuple[tuple[str, str], ...] = (
    ("int", r"\d+"),
    ("num", _NUM_OUT),
    ("hex", r"(?:0x)?[0-9a-fA-F]+"),
    ("word", r"[A-Za-z]+"),
    ("ident", r"[A-Za-z_][\w.-]*"),
    ("host", r"[A-Za-z0-9][\w.:-]*"),
    ("token", r"[^\s'\"]+"),
    ("any", r"\S+"),
)
_WILDCARD_RE = [(name, re.compile(rx)) for name, rx in _WILDCARD_CLASSES]

# Keys that name a progress field when a number follows them (rules/model.PROGRESS_FIELDS).
PROGRESS_KEYS: dict[str, str] = {
    **dict.fromkeys(("step", "steps", "iteration", "iter", "it", "global_step", "train_step"), "step"),
    **dict.fromkeys(("loss", "lm_loss", "train_loss", "train/loss", "total_loss", "lm loss"), "loss"),
    **dict.fromkeys(("grad_norm", "gnorm", "grad norm", "global_grad_norm", "total_grad_norm",
                     "optim/total_grad_norm", "grad_norm_total"), "grad_norm"),
    **dict.fromkeys(("lr", "learning_rate", "learning rate"), "lr"),
    **dict.fromkeys(("seconds", "step_time", "step_time_s", "sec/step", "s/step", "time/step"), "step_time_s"),
    **dict.fromkeys(("step_time_ms", "ms/step", "elapsed_ms", "time_ms"), "step_time_ms"),
    **dict.fromkeys(("loss_scale", "loss scale"), "loss_scale"),
}
RANK_KEYS = frozenset({"rank", "process", "process_index", "worker", "task", "local_rank", "host_id"})
_KEY_RE = re.compile(r"([A-Za-z_][\w/ ]*?)\s*[:=]?\s*$")


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    """A progress field (`step`, `loss`, ...) when captured, else a descriptive name."""
    type: str
    """The value's type: num, int, hex, path, host, time, ..."""
    captured: bool = False


@dataclass(frozen=True, slots=True)
class MinedTemplate:
    """One cluster of lines and the regex that covers it."""

    pattern: str
    """Anchored by the filter engine at both ends; matches the message after its envelope."""
    template: str
    """Human-readable template (`completed step: <num>, loss: <num>`)."""
    fields: tuple[Field, ...]
    members: tuple[int, ...]
    """Indexes (into the mined lines) of the lines Drain put in this cluster."""


def mask(message: str) -> str:
    """The message with its variable values replaced by typed placeholders."""
    return _MASK_RE.sub(lambda m: f"{_OPEN}{m.lastgroup}{_CLOSE}", message)


def _split(message: str) -> tuple[list[str], list[str]]:
    """Whitespace tokens of a message, and the whitespace around them (one more item than
    tokens: leading, between each pair, trailing)."""
    parts = re.split(r"(\s+)", message)  # token, sep, token, sep, ..., token
    tokens, seps = parts[0::2], parts[1::2]
    lead = trail = ""
    if tokens and tokens[0] == "":
        tokens = tokens[1:]
        lead = seps.pop(0) if seps else ""
    if tokens and tokens[-1] == "":
        tokens = tokens[:-1]
        trail = seps.pop() if seps else ""
    return tokens, [lead, *seps, trail]


@lru_cache(maxsize=16384)
def _split_masked(message: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Masked whitespace tokens of a message, its raw tokens, and its whitespace."""
    tokens, seps = _split(message)
    masked, _ = _split(mask(message))
    if len(masked) != len(tokens):  # a value type matched across whitespace: mask per token
        masked = [mask(t) for t in tokens]
    return tuple(masked), tuple(tokens), tuple(seps)


def _piece_regex(masked_token: str, raw_values: Sequence[str], key: str | None,
                 used: set[str], fields: list[Field], context: str) -> str:
    """Regex for one template token that Drain kept: literals and typed placeholders."""
    out: list[str] = []
    pos = 0
    raw_rx = _raw_splitter(masked_token)
    parts = [raw_rx.fullmatch(v) for v in raw_values]
    for index, m in enumerate(_PLACEHOLDER_RE.finditer(masked_token)):
        literal = masked_token[pos:m.start()]
        out.append(re.escape(literal))
        kind = m.group(1)
        values = [p.group(index + 1) for p in parts if p is not None]
        local_key = _key_before(literal) or (key if index == 0 and not literal.strip(" ([{") else None)
        out.append(_typed(kind, values, local_key, used, fields, context))
        pos = m.end()
    out.append(re.escape(masked_token[pos:]))
    return "".join(out)


def _raw_splitter(masked_token: str) -> re.Pattern[str]:
    """A regex that splits a raw token into the values behind the masked token's placeholders."""
    out, pos = [], 0
    for m in _PLACEHOLDER_RE.finditer(masked_token):
        out.append(re.escape(masked_token[pos:m.start()]))
        out.append(f"({_TYPES[m.group(1)].out})")
        pos = m.end()
    out.append(re.escape(masked_token[pos:]))
    return re.compile("".join(out))


def _key_before(literal: str) -> str | None:
    m = _KEY_RE.search(literal)
    return m.group(1).strip().lower() if m and m.group(1).strip() else None


_FLOAT_FIELDS = frozenset({"loss", "grad_norm", "lr", "step_time_s", "step_time_ms", "loss_scale"})


def _number_regex(values: Sequence[str], field: str | None) -> str:
    """The narrowest number regex for these values: a sign or a fraction only when seen
    (or when the field is a float by nature, like a loss)."""
    if field in ("step", "checkpoint_step"):
        return r"\d+"
    sign = "[+-]?" if any(v[:1] in "+-" for v in values) else ""
    if field not in _FLOAT_FIELDS and values and all(v.lstrip("+-").isdigit() for v in values):
        return sign + r"\d+"
    return sign + r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"


def _typed(kind: str, values: Sequence[str], key: str | None, used: set[str],
           fields: list[Field], context: str) -> str:
    out = _TYPES[kind].out
    if kind == "num":
        all_int = bool(values) and all(v.lstrip("+-").isdigit() for v in values)
        field = PROGRESS_KEYS.get(key or "")
        if field == "step" and re.search(r"checkpoint|ckpt", context, re.IGNORECASE):
            field = "checkpoint_step"
        if field in ("step", "checkpoint_step") and not all_int:
            field = None
        if field is not None and field not in used:
            used.add(field)
            fields.append(Field(field, "int" if all_int else "num", captured=True))
            return f"(?P<{field}>{_number_regex(values, field)})"
        name = "rank" if key in RANK_KEYS else (key or "num")
        fields.append(Field(name, "int" if all_int else "num"))
        return _number_regex(values, None)
    fields.append(Field(kind, kind))
    return out


_PREFIX_END = frozenset("=:[(/,@#<{")
_SUFFIX_START = frozenset("]),;:>}")


def _common_affixes(values: Sequence[str]) -> tuple[str, str]:
    """The literal prefix and suffix all values share, cut at a separator (`host=`, `)`), so
    that `host=trn-a17` and `host=trn-b03` become `host=` and a typed value."""
    first = values[0]
    n = 0
    while n < len(first) and all(len(v) > n and v[n] == first[n] for v in values):
        n += 1
    while n > 0 and first[n - 1] not in _PREFIX_END:
        n -= 1
    rest = [v[n:] for v in values]
    m = 0
    while m < len(rest[0]) and all(len(v) > m and v[-1 - m] == rest[0][-1 - m] for v in rest):
        m += 1
    while m > 0 and rest[0][-m] not in _SUFFIX_START:
        m -= 1
    return first[:n], (rest[0][len(rest[0]) - m:] if m else "")


def _wildcard(values: Sequence[str], fields: list[Field]) -> str:
    prefix, suffix = _common_affixes(values)
    middles = [v[len(prefix):len(v) - len(suffix)] for v in values]
    if not all(middles):
        prefix = suffix = ""
        middles = list(values)
    for (name, out), (_, rx) in zip(_WILDCARD_CLASSES, _WILDCARD_RE, strict=True):
        if all(rx.fullmatch(v) for v in middles):
            fields.append(Field(prefix.rstrip("=:[(/,@#<{").lower() or name, name))
            body = out if name in ("int", "word") else f"(?:{out})"
            return re.escape(prefix) + body + re.escape(suffix)
    fields.append(Field("any", "any"))
    return r"\S+"


def _separator(seps: Sequence[str], *, edge: bool) -> str:
    """Regex for the whitespace at one gap of the template across all members."""
    if not any(seps):
        return ""
    ws = "[ \\t]" if any("\t" in s for s in seps) else " "
    if edge or not all(seps):
        return ws + "*"
    return ws + "+"


def template_regex(members: Sequence[str], template_tokens: Sequence[str]) -> tuple[str, str, tuple[Field, ...]]:
    """The regex, readable template and fields of a Drain cluster, from its member messages."""
    split = [_split_masked(m) for m in members]
    split = [s for s in split if len(s[0]) == len(template_tokens)]
    if not split:
        raise ValueError("no member has the template's token count")
    fields: list[Field] = []
    used: set[str] = set()
    out: list[str] = [_separator([s[2][0] for s in split], edge=True)]
    readable: list[str] = []
    context = " ".join(t for t in template_tokens if t != _WILD)
    for i, token in enumerate(template_tokens):
        raw = [s[1][i] for s in split]
        if token == _WILD:
            out.append(_wildcard(raw, fields))
            readable.append("<*>")
        else:
            key = _key_before(_PLACEHOLDER_RE.sub("", template_tokens[i - 1])) if i > 0 and \
                template_tokens[i - 1] != _WILD else None
            out.append(_piece_regex(token, raw, key, used, fields, context))
            readable.append(_PLACEHOLDER_RE.sub(lambda m: f"<{m.group(1)}>", token))
        last = i == len(template_tokens) - 1
        out.append(_separator([s[2][i + 1] for s in split], edge=last))
    return "".join(out), " ".join(readable), tuple(fields)


@dataclass(frozen=True, slots=True)
class MinerParams:
    sim_th: float = 0.4
    depth: int = 4
    order: str = "natural"
    """`natural`, `reversed` or `shuffled`."""
    seed: int = 0


def variant_params(k: int) -> list[MinerParams]:
    """K different miners for self-consistency: thresholds, depths and line orders vary."""
    # Masking already made the values alike, so lines of one template differ only where a
    # word varies: thresholds are higher than Drain's default 0.4, which merges unrelated
    # short lines (the constant lead token counts as one shared token).
    sims = (0.6, 0.7, 0.5, 0.65, 0.75, 0.55, 0.8)
    orders = ("natural", "reversed", "shuffled")
    return [MinerParams(sim_th=sims[i % len(sims)], depth=4 + (i % 3 == 2),
                        order=orders[i % 3] if i < 2 else "shuffled", seed=i) for i in range(k)]


def mine(messages: Sequence[str], params: MinerParams = MinerParams(), *,
         min_support: int = 2) -> list[MinedTemplate]:
    """Templates covering at least `min_support` of the messages (envelopes already stripped)."""
    order = list(range(len(messages)))
    if params.order == "reversed":
        order.reverse()
    elif params.order == "shuffled":
        random.Random(params.seed).shuffle(order)
    from drain3.drain import Drain  # here: a job that mines nothing (most diagnoses) never loads it

    drain = Drain(depth=params.depth, sim_th=params.sim_th, max_children=100,
                  param_str=_WILD, parametrize_numeric_tokens=False)
    members: dict[int, list[int]] = {}
    clusters = {}
    for index in order:
        tokens = _split_masked(messages[index])[0]
        if not tokens:
            continue
        # A constant first token: Drain's prefix tree would otherwise never merge lines whose
        # first word differs (a host name, a log level), whatever their similarity.
        cluster, _ = drain.add_log_message(" ".join((_LEAD, *tokens)))
        members.setdefault(cluster.cluster_id, []).append(index)
        clusters[cluster.cluster_id] = cluster
    out: list[MinedTemplate] = []
    for cluster_id, indexes in members.items():
        if len(indexes) < min_support:
            continue
        tokens = clusters[cluster_id].log_template_tokens[1:]
        try:
            pattern, readable, fields = template_regex([messages[i] for i in indexes], tokens)
        except (ValueError, KeyError):
            continue
        out.append(MinedTemplate(pattern, readable, fields, tuple(sorted(indexes))))
    return out


def messages_of(lines: Sequence[str]) -> list[str]:
    """The messages of raw lines: launcher envelopes stripped, as filter patterns see them."""
    return [split_envelope(line).message for line in lines]
