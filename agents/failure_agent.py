"""The Failure Agent: diagnoses the failures the rules cannot, and writes rules back.

It runs at the end of a job when no rule resolved the failure or the rules are not sure
(`rules.job.FailureAgentHook`). Retrieval, then a decision, then write-back:

1. **Retrieval.** The compressed log (what the filter kept, already redacted) is cut into
   chunks: the lines of one shape (values masked) with their line numbers, files, ranks and
   nodes. Each chunk is embedded and put in a FAISS index of this job; each is searched in
   the knowledge base of past incidents (`agents.knowledge`). Structure (traceback headers,
   frames, C++ stacks), lines a context rule matches and lines that talk to the agent are
   never candidates.
2. **Decision.**
   - Embedded (the default): each candidate line is labelled by the similarity-weighted vote
     of its nearest incidents (rule-matched lines keep the rule's label), and the root cause
     is chosen by the rules' own evidence policy (`rules/rootcause.py`): the strongest tier
     wins wherever it appears, the earliest line within a tier.
   - With an LLM: the prompt (`prompts/failure_agent_*.txt`) gets the candidates, their
     incidents and the lines around them, and returns typed JSON. Code checks the answer:
     the line must be a real line of this log, not structure and not text addressed to the
     agent; the reason must be a taxonomy id that the retrieved evidence supports for that
     line, with the taxonomy's category and origin. An invalid answer is retried with the
     problem named, then the embedded decision is used.
3. **Write-back** (`WriteBackSink`): a diagnosis rule synthesised from the root-cause line,
   validated and checked against the labelled history by the service, stored pending (or
   active where configured). What the model says never sets a rule's status, scope, tier
   or pattern: those come from code and settings.
"""

from __future__ import annotations

import re
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import prompts
from agents.embeddings import Embedder, embedding_text
from agents.knowledge import KnowledgeBase, Neighbour, Vote, vote
from agents.llm import LLMBackend, LLMUnavailable, Message, ModelBehaviorError, parse_reply
from agents.mitigation import Facts, mitigation_for, plain_advice
from agents.templates import mask
from rules.envelope import split_envelope
from rules.locate import locate
from rules.model import TIER_RANK, DiagnosisRule, KeptLine, Tier
from rules.taxonomy import REASONS, Action, Origin, reason
from rules.verdict import Diagnosis, RootCauseView, agent_may_replace, rule_id_of

if TYPE_CHECKING:
    from rules.job import JobView

MAX_CHUNKS = 3000
"""Distinct line shapes embedded per job: error-like and rule-matched ones first, then others."""
MAX_OTHER_CHUNKS = 200
"""Shapes that are neither (the latest first): they can be no root cause, only its context
(the lines the LLM sees around a candidate, the other ranks' wording of the same failure),
and a 100 MB log has hundreds of them; each vector costs ~10-20 ms of CPU."""
NEIGHBOURS = 8
MIN_SIMILARITY = 0.40
"""A line nearer than this to no incident gets no label from the knowledge base."""
MIN_SHARE = 0.30
SURE_SIMILARITY = 0.50
"""Below this, a label from the knowledge base counts as generic evidence: a line the base
only loosely recognises explains no more than an error of unknown kind."""
RELATED_SIMILARITY = 0.88
"""Lines this similar to the root-cause line repeat it (other ranks, other wordings)."""
PROMPT_CANDIDATES = 12
PROMPT_INCIDENTS = 3
CONTEXT_LINES = 2
MAX_PROMPT_LINE = 400
MAX_MITIGATION_CHARS = 1200
SOURCE_EMBEDDED = "retrieval"
SOURCE_LLM = "failure_agent"

_STRUCTURE = re.compile(
    r"^\s*(?:[\^~][\^~ ]*$|raise\b|return\b|[-=*#]{6,}\s*$|\[\d+\]:\s*$|\w+\.py FAILED\s*$|Failures:\s*$"
    r"|<NO_OTHER_FAILURES>|\s*$)"
    # anywhere: an envelope this module does not know may stand in front
    r"|Traceback \(most recent call last\)|\bFile \"[^\"]*\", line \d+, in |During handling of the above exception"
    r"|The above exception was the direct cause"
    # Hydra's banner before the exception it reports; NCCL's INFO trace of return codes
    # (`NCCL INFO transport/net.cc:1140 -> 6`), which LogSage also counts as benign
    r"|^Error executing job with overrides: |\bNCCL INFO\b")
_TO_THE_AGENT = re.compile(
    r"(?i)\b(?:ignore|disregard|forget)\b.{0,40}\b(?:instructions?|prompt|rules?|above|previous)\b"
    r"|\b(?:label|classify|mark|diagnose|report)\s+(?:this|it|the (?:job|failure|error))\s+(?:as|a|an)\b"
    r"|\byou are (?:an?|the) (?:ai|assistant|model|llm|agent)\b|\bsystem prompt\b|\bas an ai\b"
    r"|\b(?:assistant|llm|ai agent)s?\s*[:,]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_WARNING = re.compile(r"\b[A-Z]\w*Warning: |^\s*(?:WARNING|WARN)\b|\[WARNING\]|\[W(?:\d{3,4} | \w)")
"""Python's and loggers' warnings: they report something that went on working."""
_NODE_IN_TEXT = re.compile(
    r"\b(?:node name|node|host|address|peer)[:=]?\s+(?!0x)(?P<node>[A-Za-z0-9][\w.-]*\d[\w.-]*?)(?=[<:\s,;)]|$)")
"""A node the message itself names (`node name: 10.4.0.17`, `connect to host gpu-a07`,
`remote peer hgx-17<35124>`) when no envelope says where the line came from; a memory
address (`on address 0x7f3a...`) is not a node."""


def addresses_the_agent(text: str) -> bool:
    """Text that gives instructions to whoever reads the log, rather than reporting a fault."""
    return _TO_THE_AGENT.search(text) is not None


# -- retrieval -------------------------------------------------------------------------------
@dataclass
class Chunk:
    """Lines of one shape in the compressed log: a retrieval unit with its line numbers."""

    order: int
    """Position of its first line in the compressed log (arrival order)."""
    first: KeptLine
    message: str
    count: int = 1
    line_numbers: list[tuple[str, int]] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    error_like: bool = False
    rule: DiagnosisRule | None = None
    structural: bool = False
    to_agent: bool = False


@dataclass
class Candidate:
    chunk: Chunk
    vote: Vote | None
    reason: str
    origin: str
    tier: Tier
    from_rule: bool

    @property
    def similarity(self) -> float:
        return self.vote.similarity if self.vote else 1.0

    @property
    def confidence(self) -> float:
        return self.vote.confidence if self.vote else 0.9


@dataclass
class Retrieval:
    chunks: list[Chunk]
    embedded: list[Chunk]
    votes: dict[int, Vote]
    """Vote per embedded chunk (by order)."""
    neighbours: dict[int, list[Neighbour]]
    candidates: list[Candidate]
    vectors: np.ndarray | None = None
    index: Any = None
    """FAISS index of this job's chunks (ids are chunk orders)."""
    lines: Sequence[KeptLine] = ()
    """The compressed log the chunks were made from."""

    def chunk_of(self, line: KeptLine) -> Chunk | None:
        shape = mask(split_envelope(line.text).message.strip())
        return next((c for c in self.chunks if mask(c.message) == shape), None)

    def related(self, chunk: Chunk, threshold: float = RELATED_SIMILARITY) -> list[Chunk]:
        """Chunks that repeat this one: other shapes saying the same (other ranks' wording)."""
        if self.index is None or self.vectors is None:
            return [chunk]
        pos = next((i for i, c in enumerate(self.embedded) if c.order == chunk.order), None)
        if pos is None:
            return [chunk]
        scores, ids = self.index.search(self.vectors[pos:pos + 1], 16)
        by_order = {str(c.order): c for c in self.embedded}
        return [by_order[i] for i, s in zip(ids[0], scores[0], strict=False) if s >= threshold and i in by_order]


_WRAP_HEAD = re.compile(r"[A-Za-z0-9,]$")
"""How a line that a terminal or a paste wrapped ends: mid-word or mid-sentence, with no
full stop, colon or bracket that would close a message."""
_WRAP_TAIL = re.compile(r"^[a-z]+(?:[ ,;)]|\.(?:\s|$))")
"""How its continuation starts: a lower-case word fragment followed by a space or a full stop
(`tions might run on ...`, `address. The server socket ...`), never a dotted name or a call
(`torch.distributed.elastic...Error:`, `raise(...)`), which starts a line of its own."""
WRAP_MIN_CHARS = 60
"""A wrapped line filled its terminal's width (80 columns and up; word wrap leaves a little)."""


def wrapped_rest(previous: KeptLine | None, line: KeptLine) -> bool:
    """`line` is the rest of `previous`, wrapped by a terminal or a paste: it carries on a long
    line that stopped mid-sentence (its lower-case start leaves no room for an envelope). Not
    agents.log_agent.continues, which keeps a traceback's indented or marked lines with the
    error line they follow: a wrap has neither indent nor marker."""
    return (previous is not None and previous.source == line.source
            and previous.line_number + 1 == line.line_number and len(previous.text) >= WRAP_MIN_CHARS
            and _WRAP_HEAD.search(previous.text) is not None and _WRAP_TAIL.match(line.text) is not None)


def chunk_lines(lines: Sequence[KeptLine], program) -> list[Chunk]:
    """Group the compressed log by line shape, in order of first appearance. The rest of a
    wrapped line is structure: the line it continues holds the message, and the fragment
    alone (`tions might run on corrupted/incomplete data.`) would be a candidate that no
    reader would call an error."""
    chunks: dict[str, Chunk] = {}
    previous: KeptLine | None = None
    for line in lines:
        wrapped, previous = wrapped_rest(previous, line), line
        envelope = split_envelope(line.text)
        message = envelope.message.strip()
        shape = mask(message)
        chunk = chunks.get(shape)
        if chunk is None:
            hit = program.match(envelope.message) if program is not None else None
            rule = hit[0] if hit else None
            chunk = chunks[shape] = Chunk(
                order=len(chunks), first=line, message=message, rule=rule,
                structural=(bool(_STRUCTURE.search(message)) or (rule is not None and rule.tier is Tier.CONTEXT)
                            or (wrapped and rule is None)),
                to_agent=addresses_the_agent(message))
        else:
            chunk.count += 1
        chunk.error_like |= line.error_like
        if len(chunk.line_numbers) < 32:
            chunk.line_numbers.append((line.source, line.line_number))
        rank, node = locate(envelope)
        if rank is not None and len(chunk.ranks) < 256:
            chunk.ranks.add(rank)
        if node is not None and len(chunk.nodes) < 256:
            chunk.nodes.add(node)
    return list(chunks.values())


def retrieve(lines: Sequence[KeptLine], program, knowledge: KnowledgeBase, embedder: Embedder, *,
             max_chunks: int = MAX_CHUNKS) -> Retrieval:
    """Chunks, their vectors and nearest incidents, and the candidate root-cause lines."""
    from agents.vector_store import FaissIndex

    chunks = chunk_lines(lines, program)
    usable = [c for c in chunks if not c.structural and not c.to_agent]
    first = [c for c in usable if c.error_like or c.rule is not None]
    rest = [c for c in reversed(usable) if not (c.error_like or c.rule is not None)][:MAX_OTHER_CHUNKS]
    embedded = sorted((first + rest)[:max_chunks], key=lambda c: c.order)
    votes: dict[int, Vote] = {}
    neighbours: dict[int, list[Neighbour]] = {}
    vectors = index = None
    if embedded:
        vectors = embedder.embed([embedding_text(c.message) for c in embedded])
        index = FaissIndex(embedder.dim, model=embedder.model_name)
        index.add([str(c.order) for c in embedded], vectors)
        for chunk, found in zip(embedded, knowledge.neighbours(vectors, NEIGHBOURS), strict=True):
            neighbours[chunk.order] = found
            result = vote(found)
            if result is not None:
                votes[chunk.order] = result
    candidates = [c for c in (_candidate(chunk, votes.get(chunk.order)) for chunk in embedded) if c is not None]
    return Retrieval(chunks, embedded, votes, neighbours, candidates, vectors, index, lines)


def _candidate(chunk: Chunk, result: Vote | None) -> Candidate | None:
    if chunk.rule is not None:
        return Candidate(chunk, result, chunk.rule.reason, chunk.rule.origin.value, chunk.rule.tier, True)
    if result is None or result.similarity < MIN_SIMILARITY or result.share < MIN_SHARE:
        return None
    if not chunk.error_like or _WARNING.search(chunk.message):
        return None  # chatter that merely resembles a failure (a warning about CUDA graphs) is not one
    tier = result.tier
    if result.similarity < SURE_SIMILARITY and TIER_RANK[tier] > TIER_RANK[Tier.GENERIC]:
        tier = Tier.GENERIC
    return Candidate(chunk, result, result.reason, result.origin, tier, False)


def _outweighs_rules(job: JobView, diagnosis: Diagnosis, decision: Decision) -> bool:
    """The verdict's rule for what an agent answer may replace (`rules.verdict.agent_may_replace`)."""
    root = diagnosis.root_cause
    rule_id = rule_id_of(root.source) if root is not None else None
    rule = next((f.rule for f in job.found.values() if f.rule.id == rule_id), None) if rule_id else None
    return agent_may_replace(root, rule.tier if rule is not None else None, decision.line.text,
                             decision.reason, decision.tier, error_like=decision.chunk.error_like)


def choose(candidates: Sequence[Candidate]) -> Candidate | None:
    """The rules' evidence policy: the strongest tier wins wherever it appears; within a
    tier, the earliest line (context never wins: such lines are not candidates)."""
    if not candidates:
        return None
    return min(candidates, key=lambda c: (-TIER_RANK[c.tier], c.chunk.order))


UNSUPPORTED_CONFIDENCE = 0.5
"""An infrastructure answer that no infrastructure rule's line backs: below CONFIDENT, so it
is reported as a lead to check, never acted on as a fault of the cluster."""
GUESS_CONFIDENCE = 0.5
"""A best guess is worth at most half of its vote's confidence: the reader is told to check."""


def best_guess(retrieval: Retrieval, fatal_line: str | None) -> Decision | None:
    """The failure is certain (the log says something stopped) but no candidate is sure: the
    nearest incidents' reason for the line that says so, at a low confidence, rather than
    silence. The line the run found fatal is preferred; else the error line the knowledge
    base recognises best. Never a warning, structure, or text addressed to the agent."""
    def usable(chunk: Chunk) -> bool:
        return (chunk.error_like and not chunk.structural and not chunk.to_agent
                and not _WARNING.search(chunk.message) and chunk.order in retrieval.votes)

    pool = [c for c in retrieval.embedded if usable(c)]
    if not pool:
        return None
    fatal = split_envelope(fatal_line).message.strip() if fatal_line else None
    chosen = next((c for c in pool if c.message == fatal), None) or max(
        pool, key=lambda c: (retrieval.votes[c.order].similarity, -c.order))
    result = retrieval.votes[chosen.order]
    return Decision(chosen.first, chosen, result.reason, result.origin, Tier.GENERIC,
                    round(result.confidence * GUESS_CONFIDENCE, 2), SOURCE_EMBEDDED)


# -- the LLM's answer ----------------------------------------------------------------------------
class DecisionReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    line_number: int | None = None
    file: str | None = Field(default=None, max_length=1000)
    line: str | None = Field(default=None, max_length=20000)
    reason: str = Field(max_length=64)
    category: str | None = Field(default=None, max_length=32)
    origin: str = Field(max_length=32)
    confidence: float = Field(ge=0.0, le=1.0)
    mitigation: str = Field(default="", max_length=MAX_MITIGATION_CHARS)


@dataclass(frozen=True)
class Decision:
    line: KeptLine
    chunk: Chunk
    reason: str
    origin: str
    tier: Tier
    confidence: float
    source: str
    mitigation_text: str = ""
    """The model's own mitigation (checked when used: `agents.mitigation.plain_advice`)."""
    backend: str = "embedded"
    attempts: int = 0
    problems: tuple[str, ...] = ()
    rule_backed: bool = True
    """False for an infrastructure answer that no infrastructure rule's line backs: a lead to
    check, never acted on alone (no node, no drain; a rule written from it waits for review)."""


def _category(reason_id: str) -> str | None:
    entry = reason(reason_id)
    return entry.category.value if entry.category else None


def find_line(reply: DecisionReply, retrieval: Retrieval) -> KeptLine | None:
    """The kept line the model names: by its number (and file) and text, or by text alone.
    The text must be that line's, as shown (its envelope may be left out)."""
    def same(line: KeptLine, text: str) -> bool:
        return text in (line.text.strip(), split_envelope(line.text).message.strip())

    text = (reply.line or "").strip()
    if reply.line_number is not None:
        at = [ln for ln in retrieval.lines if ln.line_number == reply.line_number and (not reply.file or ln.source == reply.file)]
        if text:
            at = [ln for ln in at if same(ln, text)]
        return at[0] if len(at) == 1 else None
    if text:
        return next((ln for ln in retrieval.lines if same(ln, text)), None)
    return None


def check_reply(reply: DecisionReply, retrieval: Retrieval) -> tuple[Decision | None, str]:
    """A decision from a model's reply, or the reason it is not acceptable (no log text)."""
    line = find_line(reply, retrieval)
    chunk = retrieval.chunk_of(line) if line is not None else None
    if line is None or chunk is None:
        return None, "the root-cause line is not a line of this log: give its line number and copy it exactly"
    if chunk.structural:
        return None, "the chosen line is part of a traceback or a failure summary, not a root cause"
    if chunk.to_agent:
        return None, "the chosen line addresses the reader instead of reporting a fault; it is never the root cause"
    if not (chunk.error_like or chunk.rule is not None):
        return None, "the chosen line is not an error line of this log: choose among the candidate lines"
    if reply.reason not in REASONS:
        return None, f"reason {reply.reason[:40]!r} is not one of the listed reason ids"
    entry = reason(reply.reason)
    if reply.category != _category(reply.reason):
        return None, f"the category of {reply.reason} is {_category(reply.reason)}"
    if entry.origin is not Origin.UNKNOWN and reply.origin != entry.origin.value:
        return None, f"the origin of {reply.reason} is {entry.origin.value}"
    if reply.origin not in {o.value for o in Origin}:
        return None, "origin must be infrastructure, user, training or unknown"
    support = _supported(chunk, reply.reason, retrieval)
    if not support:
        return None, (f"nothing retrieved for that line supports {reply.reason}: choose among the reasons of "
                      "its similar incidents or the rules")
    tier = chunk.rule.tier if chunk.rule is not None and chunk.rule.reason == reply.reason else support
    return Decision(line, chunk, reply.reason, reply.origin, tier, round(reply.confidence, 2), SOURCE_LLM,
                    reply.mitigation), ""


def _supported(chunk: Chunk, reason_id: str, retrieval: Retrieval) -> Tier | None:
    """The tier evidence gives `reason_id` for this chunk, or None when nothing supports it."""
    if chunk.rule is not None and chunk.rule.reason == reason_id:
        return chunk.rule.tier
    for n in retrieval.neighbours.get(chunk.order, ()):
        if n.incident.reason == reason_id and n.similarity >= MIN_SIMILARITY * 0.75:
            return Tier(n.incident.tier)
    return None


# -- the agent ---------------------------------------------------------------------------------
class WriteBackSink(Protocol):
    def suggest(self, job: JobView, decision: Decision, retrieval: Retrieval, mitigation: str) -> dict[str, Any]:
        """Synthesise, validate and store a rule for the decision; returns what happened
        (`status`: pending, active, exists, refused; `id`, `pattern`, `reason`)."""


@dataclass
class FailureAgent:
    """Implements rules.job.FailureAgentHook."""

    knowledge: KnowledgeBase
    embedder: Embedder
    llm: LLMBackend | None = None
    attempts: int = 3
    """LLM answers tried before the embedded decision is used."""
    max_tokens: int = 1024
    writeback: WriteBackSink | None = None
    max_chunks: int = MAX_CHUNKS
    reports: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=100))
    """What the agent did for the most recent jobs (also in each diagnosis's `agent` field)."""
    on_report: Callable[[dict[str, Any]], None] | None = None
    """Called with each job's report once the agent is done with it: for metrics."""

    def diagnose(self, job: JobView, diagnosis: Diagnosis) -> Diagnosis | None:
        lines = job.kept_lines()
        if not lines:
            return None
        retrieval = retrieve(lines, job.diagnosis_program, self.knowledge, self.embedder, max_chunks=self.max_chunks)
        decision, problems, attempts = None, [], 0
        if self.llm is not None and retrieval.candidates:
            decision, problems, attempts = self._ask(job, diagnosis, retrieval)
        if decision is None:
            decision = self._embedded(retrieval, job)
            if decision is None and (diagnosis.root_cause is None or diagnosis.root_cause.reason == "unknown"):
                decision = best_guess(retrieval, diagnosis.root_cause.line if diagnosis.root_cause else None)
            if decision is not None:
                decision = replace(decision, attempts=attempts, problems=tuple(problems))
        report = {"backend": decision.backend if decision else "embedded", "chunks": len(retrieval.chunks),
                  "embedded": len(retrieval.embedded), "candidates": len(retrieval.candidates),
                  "llm_attempts": attempts, "llm_problems": problems}
        if decision is not None and not _outweighs_rules(job, diagnosis, decision):
            report["kept_rules"] = f"{decision.reason} ({decision.tier.value}) does not outweigh the rules' evidence"
            decision = None
        self.reports.append(report)
        if decision is None:
            self._report(report)
            return None
        out = self._diagnosis(job, diagnosis, decision, retrieval, report)
        self._report(report)
        return out

    def _report(self, report: dict[str, Any]) -> None:
        if self.on_report is not None:
            self.on_report(report)

    # -- decisions ---------------------------------------------------------------------------
    @staticmethod
    def _embedded(retrieval: Retrieval, job: JobView) -> Decision | None:
        backed = [c for c in retrieval.candidates if not _unbacked_infrastructure(c, retrieval, job)]
        best = choose(backed or retrieval.candidates)
        if best is None or best.from_rule:
            return None  # the rules' own evidence is the strongest: their diagnosis stands
        return Decision(best.chunk.first, best.chunk, best.reason, best.origin, best.tier, best.confidence,
                        SOURCE_EMBEDDED)

    def _ask(self, job: JobView, diagnosis: Diagnosis, retrieval: Retrieval) -> tuple[Decision | None, list[str], int]:
        chat = self._prompt(job, diagnosis, retrieval)
        problems: list[str] = []
        for attempt in range(1, self.attempts + 1):
            try:
                text = self.llm.complete(chat, temperature=0.0, max_tokens=self.max_tokens)
                reply = parse_reply(text, DecisionReply)
            except ModelBehaviorError as exc:
                problem = f"the answer is not the JSON object asked for ({str(exc).split(': ', 1)[-1][:160]})"
            except LLMUnavailable:
                problems.append("the model did not answer")
                return None, problems, attempt
            else:
                decision, problem = check_reply(reply, retrieval)
                if decision is not None:
                    return replace(decision, backend=self.llm.name, attempts=attempt, problems=tuple(problems)), problems, attempt
            problems.append(problem)
            chat = [*chat, Message("assistant", "(answer rejected)"),
                    Message("user", f"That answer was rejected: {problem}. Answer again with the JSON object only.")]
        return None, problems, self.attempts

    def _prompt(self, job: JobView, diagnosis: Diagnosis, retrieval: Retrieval) -> list[Message]:
        nonce = secrets.token_hex(6)
        ranked = sorted(retrieval.candidates, key=lambda c: (-TIER_RANK[c.tier], -c.similarity, c.chunk.order))
        shown = ranked[:PROMPT_CANDIDATES]
        parts = []
        for c in shown:
            parts.append(_shown_line(c.chunk.first) + (f"   (x{c.chunk.count})" if c.chunk.count > 1 else ""))
            if c.from_rule:
                parts.append(f"  ~ rule {c.chunk.rule.id}: {c.reason}/{c.origin} ({c.tier.value})")
            for n in retrieval.neighbours.get(c.chunk.order, [])[:PROMPT_INCIDENTS]:
                parts.append(f"  ~ {n.similarity:.2f} {n.incident.reason}/{n.incident.origin}: "
                             f"{_CONTROL.sub(' ', n.incident.text)[:160]}")
        context = _context(job.kept_lines(), [c.chunk.first for c in shown[:3]])
        reasons = "\n".join(f"{r.id}: {r.category.value if r.category else 'none'}, {r.origin.value}: {r.summary}"
                            for r in REASONS.values())
        root = diagnosis.root_cause
        summary = (f"{root.reason} ({root.source}, confidence {root.confidence:.2f})" if root else "no known failure")
        if diagnosis.other_errors:
            summary += "; also " + ", ".join(f"{e['reason']} x{e['count']}" for e in diagnosis.other_errors[:5])
        user = prompts.render("failure_agent_decide", framework=job.meta.framework or "unknown",
                              rules_summary=summary, reasons=reasons, nonce=nonce,
                              candidates="\n".join(parts), context="\n".join(context))
        return [Message("system", prompts.render("failure_agent_system")), Message("user", user)]

    # -- the result ----------------------------------------------------------------------------
    def _diagnosis(self, job: JobView, diagnosis: Diagnosis, decision: Decision, retrieval: Retrieval,
                   report: dict[str, Any]) -> Diagnosis:
        related = retrieval.related(decision.chunk)
        nodes = sorted({n for c in related for n in c.nodes} | set(decision.chunk.nodes))
        ranks = sorted({r for c in related for r in c.ranks} | set(decision.chunk.ranks))
        envelope = split_envelope(decision.line.text)
        rank, node = locate(envelope, job.default_node(decision.line.source))
        named = [m.group("node") for m in _NODE_IN_TEXT.finditer(envelope.message)]
        for found in [node, *named]:
            if found and found not in nodes:
                nodes.insert(0, found)
        unsupported = decision.origin == Origin.INFRASTRUCTURE.value and not _infrastructure_rule_supports(
            decision.chunk, related)
        if unsupported:
            # what the agent reads as a fault of the cluster may be text a job printed (or was
            # made to print): without a line an infrastructure rule recognises, the label
            # stands at low confidence, but no node is blamed or drained on its word (making
            # the origin unknown instead cost the novel fixtures' origin 0.85 -> 0.71)
            decision = replace(decision, confidence=min(decision.confidence, UNSUPPORTED_CONFIDENCE), rule_backed=False)
        infra = decision.origin == Origin.INFRASTRUCTURE.value and not unsupported
        facts = Facts.read([c.first.text for c in related] or [decision.line.text], nodes=nodes if infra else (),
                           ranks=ranks if infra else (),
                           last_checkpoint_step=job.last_checkpoint_step())
        mitigation = mitigation_for(decision.reason, decision.origin, facts)
        advice = plain_advice(decision.mitigation_text, may_drain=infra)
        if advice:
            mitigation = f"{mitigation} Model's advice: {advice}"
        entry = reason(decision.reason)
        action = entry.action.value
        if infra and nodes and entry.action is Action.RESTART and decision.tier in (Tier.HARDWARE, Tier.NETWORK):
            action = Action.CORDON_AND_RESTART.value
        if unsupported:
            action = Action.INVESTIGATE.value
            mitigation = (f"This reads like {entry.summary}, but no rule recognises a fault of the cluster in the "
                          "log: check the line and the node before draining anything. " + mitigation)
        view = RootCauseView(
            reason=decision.reason, category=_category(decision.reason), origin=decision.origin,
            line=decision.line.text, line_number=decision.line.line_number, file=decision.line.source,
            rank=rank, node=node, confidence=decision.confidence, source=decision.source)
        others = list(diagnosis.other_errors)
        old = diagnosis.root_cause
        if old is not None and old.line != decision.line.text and old.reason != "unknown":
            others.insert(0, {"reason": old.reason, "line": old.line, "line_number": old.line_number,
                              "count": 1, "rule": rule_id_of(old.source) or old.source, "file": old.file})
        out = replace(diagnosis, root_cause=view, action=action, mitigation=mitigation, other_errors=others,
                      suspect_nodes=nodes if infra else [], suggested_rules=list(diagnosis.suggested_rules))
        report.update(decision={"reason": decision.reason, "origin": decision.origin, "tier": decision.tier.value,
                                "source": decision.source, "backend": decision.backend},
                      incidents=[{"id": n.incident.id, "reason": n.incident.reason, "similarity": round(n.similarity, 3),
                                  "text": n.incident.text[:200]}
                                 for n in retrieval.neighbours.get(decision.chunk.order, [])[:5]])
        if self.writeback is not None:
            result = self.writeback.suggest(job, decision, retrieval, mitigation)
            report["write_back"] = result
            rule = result.pop("rule", None)
            if result.get("status") in ("pending", "active"):
                out.suggested_rules.append({"id": result["id"], "kind": "diagnosis", "pattern": result["pattern"],
                                            "status": result["status"], "reason": decision.reason})
                if rule is not None:
                    out.rules_to_store = [*diagnosis.rules_to_store, rule]
        out.agent = report
        return out


def _unbacked_infrastructure(candidate: Candidate, retrieval: Retrieval, job: JobView) -> bool:
    """A fault of the cluster read, by its likeness to past incidents alone, into a line that
    is an error only in the Log Agent's judgement (no error pattern matches its words) and
    that no infrastructure rule's line backs. A job prints what it likes (an eval prompt that
    quotes an InfiniBand error, a sample of its data), so such a reading never outranks the
    job's own errors; when nothing else stands, it is still the lead (at half confidence).
    A line the error patterns flag (`CUDA Error, for getOutput ...`) keeps its reading: on
    real logs those readings are most often right."""
    return (not candidate.from_rule and candidate.origin == Origin.INFRASTRUCTURE.value
            and job.forwarded(candidate.chunk.first)
            and not _infrastructure_rule_supports(candidate.chunk, retrieval.related(candidate.chunk)))


def _infrastructure_rule_supports(chunk: Chunk, related: Sequence[Chunk]) -> bool:
    """Whether a line that an infrastructure rule matches backs an answer: the chosen line or
    one that repeats it (another rank's wording of the same fault)."""
    return any(c.rule is not None and c.rule.origin is Origin.INFRASTRUCTURE for c in (chunk, *related))


def _shown_line(line: KeptLine) -> str:
    return f"{line.source}:{line.line_number}| {_CONTROL.sub(' ', line.text)[:MAX_PROMPT_LINE]}"


def _context(lines: Sequence[KeptLine], around: Sequence[KeptLine]) -> list[str]:
    """The kept lines just before and after each given line (same file), once each."""
    position = {(ln.source, ln.line_number): i for i, ln in enumerate(lines)}
    picked: list[int] = []
    for line in around:
        i = position.get((line.source, line.line_number))
        if i is None:
            continue
        for j in range(max(0, i - CONTEXT_LINES), min(len(lines), i + CONTEXT_LINES + 1)):
            if j not in picked and lines[j].source == line.source:
                picked.append(j)
    return [_shown_line(lines[j]) for j in sorted(picked)]
