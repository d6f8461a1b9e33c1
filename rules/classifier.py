"""The rule-based classifier: matches kept lines against diagnosis rules and gathers evidence.

Every kept line is tried against all diagnosis patterns at once (one RE2 set); a line that
several rules match is credited to the specific rule of the highest tier (a `RuntimeError:
CUDA error: uncorrectable ECC error` is an ECC error before it is a RuntimeError); a generic
rule only takes lines no specific rule explains. Evidence is
kept per rule up to a bound, so an avalanche from 10,000 ranks costs fixed memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import re2

from rules.envelope import split_envelope, without_stamp
from rules.linear import NotLinear, compile_linear, refusal
from rules.locate import locate
from rules.model import TIER_RANK, DiagnosisRule, Evidence, KeptLine, Tier
from rules.timestamps import TimestampReader

EVIDENCE_PER_RULE = 32
RANKS_PER_RULE = 4096
_CHAIN_MARKERS = (
    "The above exception was the direct cause of the following exception",
    "During handling of the above exception, another exception occurred",
)
_BOX_HOST = re.compile(r"^\s*host\s*: ([A-Za-z0-9][\w.-]*)\s*$")
_BOX_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: \d+\)")
_NODELIST = re.compile(r"\bSLURM_(?:JOB_|STEP_)?NODELIST\s*[=:]\s*['\"]?([A-Za-z][\w.-]*)['\"]?\s*$")
"""A job script's banner (`echo SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST`, `env`): one host, no
range, names the node of a log with one node."""
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
"""A Python traceback frame; the indented line after it is source code, not an error report:
`    raise DatasetNotFoundError(f"Dataset '{path}' doesn't exist ...")` names an exception
class without that exception having happened."""


class DiagnosisCompileError(ValueError):
    """A diagnosis rule's pattern cannot be compiled; `reason` says why in the author's terms."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def _set_options() -> re2.Options:
    opts = re2.Options()
    opts.never_capture = True
    opts.log_errors = False
    return opts


def _no_groups(_message: str) -> None:
    return None


class DiagnosisProgram:
    """Diagnosis rules compiled once into an RE2 set, plus per-pattern group readers."""

    def __init__(self, rules: Sequence[DiagnosisRule]):
        self.rules = list(rules)
        self._owner: list[int] = []
        self._patterns: list[str] = []
        self._readers: list = []
        self._set = re2.Set(re2._Anchor.UNANCHORED, _set_options())
        for index, rule in enumerate(self.rules):
            for pattern in rule.patterns:
                # The set says which rules match; the rule's own RE2 regexp reads its groups
                # from the lines the set matched. Both are linear in the line's length, for
                # built-in, imported and agent-written rules alike. The set refuses what RE2
                # cannot run, so each reader is compiled when a line first needs it: a short
                # log matches a handful of the ~300 patterns, and compiling them all was a
                # fifth of a 10-line diagnose's work after its imports.
                try:
                    if self._set.Add(pattern.encode("utf-8")) < 0:
                        raise re2.error("the RE2 set refuses it")
                except (re2.error, UnicodeEncodeError) as exc:
                    exc = NotLinear(refusal(pattern, exc))
                    raise DiagnosisCompileError(f"rule {rule.id}: cannot compile {pattern[:100]!r}: {exc}",
                                                f"{pattern[:60]!r} {exc}") from None
                self._patterns.append(pattern)
                self._readers.append(None)
                self._owner.append(index)
        self._empty = not self._owner
        if not self._empty:
            self._set.Compile()

    def _preference(self, index: int) -> tuple[bool, int, int]:
        # A context rule decides first: its lines (a C++ frame, the DataLoader's re-raise of a
        # worker's KeyError) never name a cause, even when they quote one. A generic rule
        # ("any RuntimeError") speaks for a line only when no specific rule does:
        # `RuntimeError: NCCL communicator was aborted` is a timeout's symptom, not a
        # RuntimeError of the user's. Among the rest, the highest tier, then pack order.
        rule = self.rules[self._owner[index]]
        if rule.tier is Tier.CONTEXT:
            return False, -99, self._owner[index]  # a context line is context, whatever else it says
        return rule.tier is Tier.GENERIC, -TIER_RANK[rule.tier], self._owner[index]

    def match(self, message: str) -> tuple[DiagnosisRule, dict[str, str]] | None:
        """The best rule matching a message and the named groups it captured."""
        if self._empty:
            return None
        hits = self._set.Match(message.encode("utf-8", "replace"))
        if not hits:
            return None
        best = min(hits, key=self._preference)
        rule = self.rules[self._owner[best]]
        reader = self._readers[best]
        if reader is None:
            try:
                reader = compile_linear(self._patterns[best]).search
            except NotLinear:  # the set ran it; reading its groups alone is beyond RE2's memory
                reader = _no_groups
            self._readers[best] = reader
        m = reader(message)
        groups = {k: v for k, v in m.groupdict().items() if v is not None} if m else {}
        if m:
            groups["match"] = _quoted(message, m)
        return rule, groups


@dataclass
class RuleEvidence:
    """What one diagnosis rule found: a bounded sample and counts."""

    rule: DiagnosisRule
    count: int = 0
    items: list[Evidence] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    earliest: Evidence | None = None
    latest: Evidence | None = None
    """The last match in arrival order: whether the job trained on after it (rules.job)."""

    def add(self, item: Evidence) -> None:
        self.count += 1
        if len(self.items) < EVIDENCE_PER_RULE:
            self.items.append(item)
        if item.rank is not None and len(self.ranks) < RANKS_PER_RULE:
            self.ranks.add(item.rank)
        if item.node is not None and len(self.nodes) < RANKS_PER_RULE:
            self.nodes.add(item.node)
        if self.earliest is None or earlier(item, self.earliest):
            self.earliest = item
        if self.latest is None or item.seq > self.latest.seq:
            self.latest = item


def earlier(a: Evidence, b: Evidence) -> bool:
    """Whether a happened before b: by time stamp across files, else by arrival."""
    if a.timestamp is not None and b.timestamp is not None and a.source != b.source:
        return (a.timestamp, a.seq) < (b.timestamp, b.seq)
    return a.seq < b.seq


@dataclass
class _SourceState:
    clock: TimestampReader
    last_time: float | None = None
    chain_pending: dict[int | None, int] = field(default_factory=dict)
    last_evidence: dict[int | None, int] = field(default_factory=dict)
    after_frame: dict[int | None, int] = field(default_factory=dict)
    """Streams whose last line read was a traceback frame (`File "x.py", line 3, in f`), with
    that frame's indentation: its source line follows, indented deeper."""
    box_host: str | None = None
    """The `host :` of the torchrun failure box entry being read."""


class Classifier:
    """Feeds on kept lines, in order, from one or more sources of one job."""

    def __init__(self, program: DiagnosisProgram, *, default_year: int = 1970):
        self.program = program
        self.seq = 0
        self.found: dict[str, RuleEvidence] = {}
        self._sources: dict[str, _SourceState] = {}
        self._default_year = default_year
        self.default_nodes: dict[str, str] = {}
        """Node to assume for lines of a source that do not name one (one file per node)."""
        self.rank_nodes: dict[int, str] = {}
        """Global rank -> host, as torchrun's failure boxes give them."""

    def __getstate__(self) -> dict:
        """Everything but the compiled program, which the owner reattaches."""
        return {k: v for k, v in self.__dict__.items() if k != "program"}

    def learn_placement(self, line: KeptLine) -> None:
        """Read a rank's host from torchrun's failure box (`host : gpu-017`, then `rank : 12
        (local_rank: 4)`): under `--tee` the box is the only place that names a rank's node;
        and a one-node job's node from its banner's SLURM_JOB_NODELIST."""
        state = self._state(line.source)
        message = split_envelope(line.text).message
        m = _NODELIST.search(message)
        if m:
            self.default_nodes.setdefault(line.source, m.group(1))
            return
        m = _BOX_HOST.match(message)
        if m:
            state.box_host = m.group(1)
            return
        m = _BOX_RANK.match(message)
        if m and state.box_host is not None and len(self.rank_nodes) < RANKS_PER_RULE:
            self.rank_nodes.setdefault(int(m.group(1)), state.box_host)
            state.box_host = None

    def node_of(self, evidence: Evidence) -> str | None:
        """The node of an error line: its own, or the host a failure box gave its rank."""
        if evidence.node is not None or evidence.rank is None:
            return evidence.node
        return self.rank_nodes.get(evidence.rank)

    def latest_time(self) -> float | None:
        """The latest time stamp read from an error line of any source (seconds)."""
        times = [state.last_time for state in self._sources.values() if state.last_time is not None]
        return max(times) if times else None

    def _state(self, source: str) -> _SourceState:
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = _SourceState(TimestampReader(self._default_year))
        return state

    def feed(self, line: KeptLine) -> Evidence | None:
        self.seq += 1
        state = self._state(line.source)
        envelope = split_envelope(line.text)
        stamp = state.clock.read(line.text)  # the envelope may be where the time is
        if stamp is not None:
            state.last_time = stamp
        rank, node = locate(envelope, self.default_nodes.get(line.source))
        stream = rank if rank is not None else envelope.local_rank
        shape = without_stamp(envelope.message)  # a stamp in front hides no frame
        indent = len(shape) - len(shape.lstrip())
        if _FRAME.match(shape):
            state.after_frame[stream] = indent
            return None
        frame_indent = state.after_frame.pop(stream, None)
        if frame_indent is not None and indent > frame_indent:
            # the frame's source line (`raise ConfigError(...)`), deeper than its frame; the
            # exception of a traceback that torchrun's box indents is not (the source line,
            # not error-like, never came here: the next error line did)
            return None
        if any(marker in shape for marker in _CHAIN_MARKERS):
            if stream in state.last_evidence:
                state.chain_pending[stream] = state.last_evidence[stream]
            return None
        hit = self.program.match(envelope.message)
        if hit is None and shape is not envelope.message:
            hit = self.program.match(shape)  # a rule written from the message, behind a collector's stamp
        if hit is None:
            return None
        rule, groups = hit
        item = Evidence(
            rule_id=rule.id, reason=rule.reason, tier=rule.tier, line=line.text,
            line_number=line.line_number, source=line.source, seq=self.seq, rank=rank, node=node,
            timestamp=state.last_time, groups=groups, chained_from=state.chain_pending.pop(stream, None),
        )
        if rule.tier is not Tier.CONTEXT:
            state.last_evidence[stream] = self.seq
        found = self.found.get(rule.id)
        if found is None:
            found = self.found[rule.id] = RuleEvidence(rule)
        found.add(item)
        return item


MAX_QUOTE = 200


def _quoted(message: str, m: re.Match[str]) -> str:
    """`{match}`: the error as the line says it, from where the pattern matched to the end of
    the line. A pattern often stops at the exception's type (`ValueError: `), and "A value is
    invalid (ValueError: )" tells the reader nothing the reason did not."""
    text = message[m.start():].strip(" \t\r[(:")
    return text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE - 1].rstrip() + "…"


_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_PLACEHOLDER_DEFAULTS = {"node": "the node that reported it", "rank": "the rank that reported it", "file": "the log"}
_UNKNOWN_RANK = [
    # the sentence is rewritten rather than filled with a phrase: "(rank the rank that
    # reported it)" and "Rank the rank that reported it ran out" read as holes
    (re.compile(r"\s*\((?:on )?rank \{rank\}\)"), ""),
    (re.compile(r"\bRank \{rank\}"), "A rank"),
    (re.compile(r"\b(?:on |of )?rank \{rank\}"), "one rank"),
]


_HOLE = re.compile(r"\{\w+\}|\b(?:rank|node) the (?:rank|node) that reported it|\b(?:[Oo]n|of|at|in|rank|node|[Cc]ordon|[Dd]rain) None\b")


def holes(text: str) -> list[str]:
    """What a rendered mitigation shows where a value should be: a `{name}` left unfilled, a
    default phrase inside a sentence that names one ("rank the rank that reported it"), a
    Python None where a node or rank belongs ("Cordon None"; "None of the ranks" is English).
    A reader must never see these (`faultline eval` counts them)."""
    return [m.group(0) for m in _HOLE.finditer(text)]


def render_mitigation(template: str, values: dict[str, object]) -> str:
    """Fill `{name}` placeholders of a rule's mitigation.

    Plain substitution, not str.format: an agent-written template must not reach
    attributes of the values, and log text only ever lands in the values.
    """
    def fill(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        if value is None:
            name = m.group(1)
            # a group the matching pattern does not have: point at the line, never show `{g_x}`
            return _PLACEHOLDER_DEFAULTS.get(name, "(see the error line)" if name.startswith("g_") else m.group(0))
        return str(value)

    if values.get("rank") is None:
        for pattern, text in _UNKNOWN_RANK:
            template = pattern.sub(text, template)
    return _PLACEHOLDER.sub(fill, template)
