"""The Log Agent: kept lines in, segments, K proposals, a vote, validation, rules out.

It plugs into a job through `rules.job.LogAgentHook`: `observe(job, kept)` sees the
lines that survived the filter (already redacted) and returns the filter rules accepted for
the job, which `JobRun` applies to its running streams from the next buffer on; `finish(job)`
learns from the last, partial segment. Accepted rules are stored with their provenance.

Where learned rules apply (their scope), and why:

- a job with a name: `family:<job family>` (the name without run ids and dates, or a
  `family:<x>` tag), status `active`. A resubmitted job starts with its family's rules,
  which is the point of learning; a family is narrow, so a rule never leaks into other
  users' jobs.
- no name, but a framework: `framework:<name>`, `active`: the rule describes that
  framework's output.
- neither: `global` but `pending`. A global rule would apply to every future job of every
  format, and nothing about an anonymous log says it is representative; the rule still
  takes effect in the job that learned it, and a person can approve it for everyone.

What a log line says never changes what the agent may do: lines reach an LLM only inside a
delimited block of the user message, and the only outcome of a reply is a candidate
pattern that must win the vote and pass validation in code.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agents.proposals import Ballot, EmbeddedBackend, ProposalBackend
from agents.segments import Segment, Segmenter
from agents.templates import mask, messages_of
from agents.validation import Validation, Validator, load_error_corpus
from agents.voting import Candidate, Decision, Proposal, quorum_for, vote
from agents.samples import HELD_OUT_HEALTHY
from rules.filters import FilterCompileError, FilterProgram
from rules.guard import ErrorGuard
from rules.model import FilterRule, KeptLine, RuleStatus

if TYPE_CHECKING:
    from rules.job import JobMeta, JobView

log = logging.getLogger(__name__)

# Words that make a line worth a person's attention although the guard did not flag it.
# A line with one of them whose shape is still rare in the job is forwarded to the
# classifier and protected from rules; a shape repeated on every step is routine.
ALERT_WORDS = re.compile(
    r"(?i)\b(?:warn(?:ing)?s?|nan|inf|diverg\w*|retry(?:ing)?|retries|timeout|lost|unreachable|"
    r"preempt\w*|unhealthy|mismatch\w*|overflow\w*|invalid|refused|denied|exceeded|deadline|"
    r"stuck|hung|hang(?:ing)?|cannot|could not|unable|not found|degraded|evicted|straggler\w*)\b")
SHAPES_TRACKED = 4096
RECENT_ERRORS = 256
CONTEXT_TRACKED = 65536
# A continuation of the error line before it, once the prefix both share is set aside: an
# indented traceback code line, a `/job:...` task list, a `^~~~` marker.
CONTINUATION = re.compile(r"^(?:/|\.\.\.|\^|~)")


def continues(line: str, previous: str) -> bool:
    """Whether `line` continues `previous` (an error line): after the prefix both share
    (a pod or host prefix, taken back to a token boundary), it is indented deeper than the
    error line, or starts like a continuation (`/job:...`, `^~~`, `...`)."""
    n, limit = 0, min(len(line), len(previous))
    while n < limit and line[n] == previous[n]:
        n += 1
    while n > 0 and line[n - 1].isspace():
        n -= 1
    while n > 0 and not (line[n - 1].isspace() or line[n - 1] in "]:|"):
        n -= 1
    rest, before = line[n:], previous[n:]
    indent = len(rest) - len(rest.lstrip())
    return indent > len(before) - len(before.lstrip()) or bool(CONTINUATION.match(rest.lstrip()))


@dataclass
class LogAgentConfig:
    votes: int = 5
    """K: independent proposals per segment."""
    agreement: float = 0.5
    """A rule wins with more than this share of the K votes (3 of 5)."""
    segment_lines: int = 256
    segment_bytes: int = 64 << 10
    segment_seconds: float = 30.0
    """Live mode: a segment closes when its oldest line is this old."""
    min_support: int = 3
    """A rule must match at least this many lines of its segment."""
    backlog_lines: int = 512
    """Unexplained lines carried to the next segment, so rare shapes build up support."""
    max_segments: int = 400
    """Segments a job may spend learning on; past it the agent only forwards error lines."""
    max_rules: int = 100
    """Rules one job may learn: a guard against explosion on a log of unique lines."""

    def __post_init__(self) -> None:
        if not 1 <= self.votes <= 15:
            raise ValueError(f"votes must be between 1 and 15, got {self.votes}")
        if self.min_support < 1:
            raise ValueError(f"min_support must be at least 1, got {self.min_support}")
        for name in ("segment_lines", "segment_bytes", "backlog_lines", "max_segments", "max_rules"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        quorum_for(self.votes, self.agreement)  # raises on a bad agreement


class RuleSink(Protocol):
    """Where accepted rules are stored (the database)."""

    def status_of(self, rule_id: str) -> str | None: ...

    def save(self, rule: FilterRule, *, status: str, provenance: dict[str, Any]) -> None: ...


class MemorySink:
    """Keeps rules in memory: for benchmarks and jobs without a database."""

    def __init__(self) -> None:
        self.rules: dict[str, tuple[FilterRule, str, dict[str, Any]]] = {}

    def status_of(self, rule_id: str) -> str | None:
        entry = self.rules.get(rule_id)
        return entry[1] if entry else None

    def save(self, rule: FilterRule, *, status: str, provenance: dict[str, Any]) -> None:
        self.rules.setdefault(rule.id, (rule, status, provenance))


def learned_scope(meta: JobMeta) -> tuple[str, RuleStatus]:
    """Scope and status of the rules learned on this job (see the module docstring)."""
    family = meta.family
    if family:
        return f"family:{family}", RuleStatus.ACTIVE
    if meta.framework:
        return f"framework:{meta.framework}", RuleStatus.ACTIVE
    return "global", RuleStatus.PENDING


def rule_id(scope: str, pattern: str) -> str:
    """Deterministic: the same pattern learned twice for one scope is one rule."""
    return "la-" + hashlib.sha1(f"{scope}\0{pattern}".encode()).hexdigest()[:12]


class LogAgent:
    """Process-wide: configuration, backends and the validator; `for_job` makes the hook."""

    def __init__(self, config: LogAgentConfig, *, backend: Callable[[], ProposalBackend] | None = None,
                 sink: RuleSink | None = None, guard: ErrorGuard | None = None,
                 builtin_examples: Sequence[str] = (), evidence_examples: Sequence[str] = (),
                 corpus: Sequence[str] | None = None, on_report: Callable[[dict[str, Any]], None] | None = None):
        self.config = config
        self.on_report = on_report
        """Called with each segment's report (votes, acceptances, rejections): for metrics."""
        self.fallback = EmbeddedBackend(min_support=config.min_support)
        self._backend = backend or (lambda: self.fallback)
        self.sink = sink or MemorySink()
        self.guard = guard or ErrorGuard()
        self.validator = Validator(
            guard=self.guard, corpus=list(corpus) if corpus is not None else load_error_corpus(),
            held_out=[*HELD_OUT_HEALTHY, *builtin_examples], evidence=list(evidence_examples),
            min_support=config.min_support)

    def for_job(self, meta: JobMeta) -> JobLogAgent:
        return JobLogAgent(self, meta, self._backend())

    def resume(self, state: dict[str, Any]) -> JobLogAgent:
        """A job's agent from JobLogAgent.state(), on this process's agent and backends (a
        live job's appends may reach any replica)."""
        job = JobLogAgent.__new__(JobLogAgent)
        job.__dict__.update(state)
        job.agent, job.config = self, self.config
        job.backend = self._backend()
        calls_left = state.get("_calls_left")
        if calls_left is not None and hasattr(job.backend, "calls_left"):
            job.backend.calls_left = calls_left  # the job's LLM budget survives the move
        return job


class JobLogAgent:
    """The Log Agent for one job (implements rules.job.LogAgentHook)."""

    def __init__(self, agent: LogAgent, meta: JobMeta, backend: ProposalBackend):
        self.agent = agent
        self.config = agent.config
        self.meta = meta
        self.backend = backend
        self.scope, self.status = learned_scope(meta)
        self.segmenter = Segmenter(self.config.segment_lines, self.config.segment_bytes,
                                   self.config.segment_seconds)
        self.backlog: deque[KeptLine] = deque(maxlen=self.config.backlog_lines)
        self.accepted: list[FilterRule] = []
        self.reports: deque[dict[str, Any]] = deque(maxlen=64)
        """What happened to the last segments (votes, rejections): for people and benchmarks."""
        self.segments_seen = 0
        self._shapes: OrderedDict[str, int] = OrderedDict()
        self._recent_errors: deque[str] = deque(maxlen=RECENT_ERRORS)
        self._ids: set[str] = set()
        self._context: set[tuple[str, int]] = set()
        """Lines that continue an error (traceback code lines): never mined, never filtered."""
        self._last_error: dict[str, tuple[int, str]] = {}

    def state(self) -> dict[str, Any]:
        """What the job has learned and is working on, without the process-wide parts."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("agent", "config", "backend")}
        state["_calls_left"] = getattr(self.backend, "calls_left", None)
        return state

    # -- the hook ----------------------------------------------------------------------------
    def observe(self, job: JobView, kept: list[KeptLine]) -> list[FilterRule]:
        self._screen(job, kept)
        rules: list[FilterRule] = []
        for segment in self.segmenter.add(kept):
            rules += self._learn(job, segment)
        return rules

    def finish(self, job: JobView) -> list[FilterRule]:
        segment = self.segmenter.flush()
        if segment is None or len(segment.lines) + len(self.backlog) < self.config.min_support:
            return []
        return self._learn(job, segment)

    # -- error lines -------------------------------------------------------------------------
    def _shape_count(self, line: KeptLine, *, add: bool) -> int:
        shape = mask(line.text)
        count = self._shapes.pop(shape, 0) + (1 if add else 0)
        self._shapes[shape] = count
        if len(self._shapes) > SHAPES_TRACKED:
            self._shapes.popitem(last=False)
        return count

    def _suspect(self, line: KeptLine) -> bool:
        """Error context, or an alert word in a shape that is not (yet) routine in this job."""
        if (line.source, line.line_number) in self._context:
            return True
        return bool(ALERT_WORDS.search(line.text)) and \
            self._shapes.get(mask(line.text), 0) < self.config.min_support

    def _screen(self, job: JobView, kept: list[KeptLine]) -> None:
        forward = []
        for line in kept:
            if line.error_like:
                self._recent_errors.append(line.text)
                self._last_error[line.source] = (line.line_number, line.text)
                continue
            number, previous = self._last_error.get(line.source, (0, ""))
            if number == line.line_number - 1 and continues(line.text, previous):
                # a traceback's code line, a task list: part of the error above it
                if len(self._context) < CONTEXT_TRACKED:
                    self._context.add((line.source, line.line_number))
                self._last_error[line.source] = (line.line_number, previous)
                continue
            if ALERT_WORDS.search(line.text) and self._shape_count(line, add=True) < self.config.min_support:
                forward.append(line)
        if forward:
            job.forward_error_lines(forward)
            # what was called an error in this job is not routine later in it: no rule learned
            # from this job may drop its shape (the diagnosis may already rest on those lines)
            self._recent_errors.extend(line.text for line in forward)

    # -- learning ----------------------------------------------------------------------------
    def _learn(self, job: JobView, segment: Segment) -> list[FilterRule]:
        self._recent_errors.extend(e.text for e in segment.errors)
        lines = [*self.backlog, *segment.lines]
        if self.segments_seen >= self.config.max_segments or len(self.accepted) >= self.config.max_rules:
            self.backlog.extend(segment.lines)
            return []
        self.segments_seen += 1
        suspects = [line for line in lines if self._suspect(line)]
        minable = [line for line in lines if not self._suspect(line)]
        raw = [line.text for line in minable]
        messages = messages_of(raw)
        backend, ballots, discarded = self._ballots(messages)
        flagged = self._flagged_errors(ballots, minable)
        if flagged:
            job.forward_error_lines(flagged)
        errors = [*(line.text for line in suspects), *(line.text for line in flagged), *self._recent_errors]
        decision, proposals = self._vote(backend, ballots, raw, messages)
        accepted, report = self._accept(job, segment, backend, decision, proposals, raw, errors, ballots)
        if discarded:
            # the failed votes of the backend the miner stood in for: a model that never
            # answers usefully must show in the figures, not vanish behind the fallback
            report["discarded_ballots"] = len(discarded)
            report["discarded_from"] = self.backend.model
            report["discarded_failures"] = _failures(discarded)
        covered = set().union(*(v.covers for _, v in accepted)) if accepted else set()
        flagged_ids = {id(line) for line in flagged}
        self.backlog.clear()
        self.backlog.extend(line for i, line in enumerate(minable) if i not in covered and id(line) not in flagged_ids)
        self.reports.append(report)
        if self.agent.on_report is not None:
            self.agent.on_report(report)
        return [rule for rule, _ in accepted]

    def _ballots(self, messages: Sequence[str]) -> tuple[ProposalBackend, list[Ballot], list[Ballot]]:
        """The backend whose ballots count, its ballots, and the failed ballots it replaced."""
        k = self.config.votes
        ballots = self.backend.propose(messages, k, framework=self.meta.framework or "")
        if ballots and not all(b.failure for b in ballots):
            return self.backend, ballots, []
        if self.backend is not self.agent.fallback:
            # no usable LLM reply (down, out of budget, all malformed): mine instead
            log.info("log agent: %s gave no usable ballot; embedded miner used for this segment", self.backend.model)
            return self.agent.fallback, self.agent.fallback.propose(messages, k), ballots
        return self.backend, ballots, []

    def _flagged_errors(self, ballots: Sequence[Ballot], lines: Sequence[KeptLine]) -> list[KeptLine]:
        """Lines a quorum of ballots called errors."""
        quorum = quorum_for(self.config.votes, self.config.agreement)
        counts: dict[int, int] = {}
        for ballot in ballots:
            for i in ballot.error_lines:
                counts[i] = counts.get(i, 0) + 1
        return [lines[i] for i, n in sorted(counts.items()) if n >= quorum and 0 <= i < len(lines)]

    def _vote(self, backend: ProposalBackend, ballots: Sequence[Ballot], raw: Sequence[str],
              messages: Sequence[str]) -> tuple[Decision, list[Proposal]]:
        data = [line.encode("utf-8", "replace") for line in raw]
        covers_of: dict[str, frozenset[int]] = {}
        proposals = []
        for ballot in ballots:
            for p in ballot.proposals:
                if p.pattern not in covers_of:
                    covers_of[p.pattern] = _coverage(p.pattern, data, self.agent.guard)
                proposals.append(Proposal(ballot.voter, p.pattern, covers_of[p.pattern], p.claims,
                                          p.fields, p.description))
        decision = vote(proposals, k=self.config.votes, agreement=self.config.agreement,
                        judge=lambda group: backend.judge(group, messages))
        return decision, proposals

    def _accept(self, job: JobView, segment: Segment, backend: ProposalBackend, decision: Decision,
                proposals: Sequence[Proposal], raw: Sequence[str], errors: Sequence[str],
                ballots: Sequence[Ballot]) -> tuple[list[tuple[FilterRule, Validation]], dict[str, Any]]:
        evidence = [e.line for found in job.found.values() for e in found.items]
        accepted: list[tuple[FilterRule, Validation]] = []
        rejected: list[dict[str, Any]] = []
        for candidate in decision.accepted:
            if len(self.accepted) >= self.config.max_rules:
                break
            for pattern in candidate.patterns:
                claims = frozenset().union(*(p.claims for p in candidate.proposals if p.pattern == pattern))
                validation = self.agent.validator.validate(pattern, segment=raw, claims=claims,
                                                           errors=errors, evidence=evidence)
                if not validation.ok:
                    rejected.append({"pattern": pattern[:300], "failed": validation.failed,
                                     "why": [c.detail for c in validation.checks if not c.ok]})
                    continue
                rule = self._keep(candidate, pattern, validation, backend, decision, segment, raw, ballots)
                if rule is not None:
                    accepted.append((rule, validation))
                break
        report = {"segment": segment.seq, "lines": len(raw), "backend": backend.model, "kind": backend.kind,
                  "ballots": len(ballots), "failed_ballots": sum(1 for b in ballots if b.failure),
                  "failures": _failures(ballots), "salvaged_ballots": sum(1 for b in ballots if b.salvaged),
                  "proposals": len(proposals), "winners": len(decision.accepted),
                  # a pattern that matches no line of the segment (or that RE2 refuses) never
                  # becomes a candidate: it is out before the vote
                  "matching_nothing": sum(1 for p in proposals if not p.covers),
                  "below_quorum": len(decision.below_quorum), "accepted": [r.id for r, _ in accepted],
                  "rejected": rejected}
        return accepted, report

    def _keep(self, candidate: Candidate, pattern: str, validation: Validation, backend: ProposalBackend,
              decision: Decision, segment: Segment, raw: Sequence[str], ballots: Sequence[Ballot]) -> FilterRule | None:
        rid = rule_id(self.scope, pattern)
        if rid in self._ids:
            return None
        stored = self.agent.sink.status_of(rid)
        if stored in (RuleStatus.REJECTED, RuleStatus.DISABLED):
            return None  # a person turned this exact rule down: do not bring it back
        proposal = next(p for p in candidate.proposals if p.pattern == pattern)
        rule = FilterRule(id=rid, pattern=pattern, description=proposal.description[:200] or "learned by the Log Agent",
                          scope=self.scope, source=f"log_agent:{backend.kind}", trusted=False)
        tie = next((how for group, how in zip(decision.ties, decision.tie_breaks, strict=True)
                    if candidate in group), None)
        provenance = {
            "backend": backend.kind, "model": backend.model, "votes": candidate.votes, "k": self.config.votes,
            "quorum": decision.quorum, "voters": sorted(candidate.voters),
            "failed_votes": sum(1 for b in ballots if b.failure), "tie_break": tie,
            "fields": list(proposal.fields), "template": proposal.description[:300],
            "covers": len(validation.covers),
            "evidence": [raw[i][:500] for i in sorted(validation.covers)[:5]],
            "segment": {"seq": segment.seq, "sources": segment.sources,
                        "first_line": segment.first_line, "last_line": segment.last_line},
            "validation": validation.to_dict(),
            "job": {"name": self.meta.name, "framework": self.meta.framework, "tags": list(self.meta.tags)},
        }
        if stored is None:
            self.agent.sink.save(rule, status=self.status.value, provenance=provenance)
        self._ids.add(rid)
        self.accepted.append(rule)
        return rule


def _failures(ballots: Sequence[Ballot]) -> dict[str, int]:
    """Failed ballots by kind (`malformed`, `unavailable`)."""
    out: dict[str, int] = {}
    for ballot in ballots:
        if ballot.failure:
            out[ballot.failure] = out.get(ballot.failure, 0) + 1
    return out


def _coverage(pattern: str, lines: Sequence[bytes], guard: ErrorGuard) -> frozenset[int]:
    """Lines the pattern matches under the engine's semantics (RE2: linear time whatever the
    pattern); nothing when the engine refuses it."""
    try:
        program = FilterProgram([FilterRule("candidate", pattern, trusted=False)], guard)
    except (FilterCompileError, ValueError):
        return frozenset()
    return frozenset(i for i, line in enumerate(lines) if program.rules_matching(line))
