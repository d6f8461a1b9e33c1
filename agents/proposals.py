"""Typed proposals and the two backends that make them, behind one small interface.

A backend takes the messages of a segment (envelopes stripped) and returns K ballots: one
per independent proposer (a Drain miner with its own parameters and line order, or one LLM
reply sampled with temperature). A ballot is a list of proposed patterns, each with the
lines it claims to cover and the fields it captures, plus the lines it thinks are errors. A
reply that does not parse is a failed ballot, never an exception: the vote goes on without it.

What a backend proposes is only ever a candidate: the vote (agents/voting.py) and the
validation (agents/validation.py), both in code, decide what becomes a rule.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

import prompts
from agents.llm import (
    LLMBackend,
    LLMUnavailable,
    Message,
    ModelBehaviorError,
    parse_reply,
    salvage_items,
    truncate_to_budget,
)
from agents.templates import mask, mine, variant_params
from agents.validation import MAX_PATTERN_CHARS
from agents.voting import Candidate


# -- what an LLM must answer ----------------------------------------------------------------
class ProposedRule(BaseModel):
    model_config = ConfigDict(extra="ignore")

    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)
    covers: list[int | str] = Field(default_factory=list, max_length=2000)
    """Line numbers (as shown) or exact line texts the pattern is meant to match."""
    fields: list[str] = Field(default_factory=list, max_length=20)
    description: str = Field(default="", max_length=500)


class ProposalReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rules: list[ProposedRule] = Field(default_factory=list, max_length=50)
    error_lines: list[int] = Field(default_factory=list, max_length=2000)

    @model_validator(mode="before")
    @classmethod
    def _an_answer(cls, data: Any) -> Any:
        """A bare list of rules is accepted as {"rules": [...]}. Anything else must name at
        least one of the keys: the tolerant parser finds `[]` or `{}` in a reply that is a
        Python program or prose, and mis-named keys (`{"lines": [0, 1]}`) would otherwise pass
        as an empty vote, counted as cast while it said nothing."""
        if isinstance(data, list):
            if not data or not all(isinstance(item, dict) for item in data):
                raise ValueError("not a list of rules")
            return {"rules": data}
        if isinstance(data, dict) and not {"rules", "error_lines"} & data.keys():
            raise ValueError("neither `rules` nor `error_lines`")
        return data


class JudgeReply(BaseModel):
    choice: int


# -- ballots --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RawProposal:
    pattern: str
    claims: frozenset[int]
    """Indexes into the segment's messages; -1 for a claimed line that is not there."""
    fields: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Ballot:
    voter: int
    proposals: tuple[RawProposal, ...] = ()
    error_lines: frozenset[int] = frozenset()
    failure: str | None = None
    """`malformed` (the reply did not parse), `unavailable` (no answer), or None."""
    salvaged: bool = False
    """The reply did not parse as a whole (cut off at max_tokens, or broken further on); its
    complete leading rules were kept and its error lines, which come after them, were lost."""


class ProposalBackend(Protocol):
    kind: str
    """`embedded` or `llm`: the `log_agent:<kind>` source of the rules it leads to."""
    model: str
    """What proposed: `drain3`, or `openai:<model>`."""

    def propose(self, messages: Sequence[str], k: int, *, framework: str = "") -> list[Ballot]:
        """K independent ballots over the segment's messages."""

    def judge(self, candidates: Sequence[Candidate], messages: Sequence[str]) -> int | None:
        """Break a tie between candidates (index), or None."""


def strip_anchors(pattern: str) -> str:
    """The engine anchors every pattern itself; `^...$` from a proposer would never match."""
    text = pattern.strip()
    if text.startswith("^"):
        text = text[1:]
    if text.endswith("$") and not text.endswith("\\$"):
        text = text[:-1]
    return text


# -- the embedded backend -------------------------------------------------------------------
@dataclass
class EmbeddedBackend:
    """Template mining (Drain) with K different thresholds, depths and line orders."""

    min_support: int = 3
    kind: str = "embedded"
    model: str = "drain3"

    def propose(self, messages: Sequence[str], k: int, *, framework: str = "") -> list[Ballot]:
        ballots = []
        for voter, params in enumerate(variant_params(k)):
            templates = mine(messages, params, min_support=self.min_support)
            ballots.append(Ballot(voter, tuple(
                RawProposal(t.pattern, frozenset(t.members), tuple(f.name for f in t.fields if f.captured),
                            t.template) for t in templates)))
        return ballots

    def judge(self, candidates: Sequence[Candidate], messages: Sequence[str]) -> int | None:
        return None


# -- the LLM backend ------------------------------------------------------------------------
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
EXAMPLES_PER_SHAPE = 3


@dataclass
class LLMProposalBackend:
    """K replies of an OpenAI-compatible model, sampled with temperature, in parallel."""

    llm: LLMBackend
    temperature: float = 0.7
    max_tokens: int = 1024
    """Reply budget per call."""
    prompt_tokens: int = 3000
    """Budget for the log lines of one segment in the prompt."""
    max_calls: int = 60
    """Calls per job (proposals and judge); past it the agent falls back to the embedded miner."""
    workers: int = 4
    kind: str = "llm"

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if self.prompt_tokens < 100:
            raise ValueError(f"prompt_tokens must be at least 100, got {self.prompt_tokens}")
        self.model = self.llm.name
        self.calls_left = self.max_calls

    def propose(self, messages: Sequence[str], k: int, *, framework: str = "") -> list[Ballot]:
        if self.calls_left < k:
            return []
        self.calls_left -= k
        shown = self._shown(messages)
        nonce = secrets.token_hex(6)
        block = "\n".join(f"{i}| {_CONTROL.sub(' ', messages[i])}" for i in shown)
        chat = [Message("system", prompts.render("log_agent_system")),
                Message("user", prompts.render("log_agent_propose", count=len(shown), framework=framework or "unknown",
                                               nonce=nonce, lines=block))]
        with ThreadPoolExecutor(max_workers=max(1, min(k, self.workers))) as pool:
            return list(pool.map(lambda voter: self._ballot(voter, chat, messages), range(k)))

    def _shown(self, messages: Sequence[str]) -> list[int]:
        """Indexes of the lines put in the prompt: a few examples per shape, within budget."""
        seen: dict[str, int] = {}
        picked = []
        for i, text in enumerate(messages):
            shape = mask(text)
            if seen.get(shape, 0) < EXAMPLES_PER_SHAPE:
                seen[shape] = seen.get(shape, 0) + 1
                picked.append(i)
        kept = truncate_to_budget([f"{i}| {messages[i]}" for i in picked], self.prompt_tokens)
        return picked[:len(kept)]

    def _ballot(self, voter: int, chat: list[Message], messages: Sequence[str]) -> Ballot:
        try:
            text = self.llm.complete(chat, temperature=self.temperature, max_tokens=self.max_tokens)
        except ModelBehaviorError:
            return Ballot(voter, failure="malformed")
        except LLMUnavailable:
            return Ballot(voter, failure="unavailable")
        salvaged = False
        try:
            reply = parse_reply(text, ProposalReply)
        except ModelBehaviorError:
            rules = salvage_items(text, "rules", ProposedRule, limit=50)
            if not rules:
                return Ballot(voter, failure="malformed")
            reply, salvaged = ProposalReply(rules=rules), True
        index = {text: i for i, text in reversed(list(enumerate(messages)))}
        proposals = tuple(
            RawProposal(strip_anchors(rule.pattern), frozenset(_claim(c, index, len(messages)) for c in rule.covers),
                        tuple(rule.fields), rule.description[:200])
            for rule in reply.rules)
        errors = frozenset(i for i in reply.error_lines if 0 <= i < len(messages))
        return Ballot(voter, proposals, errors, salvaged=salvaged)

    def judge(self, candidates: Sequence[Candidate], messages: Sequence[str]) -> int | None:
        if self.calls_left < 1:
            return None
        self.calls_left -= 1
        nonce = secrets.token_hex(6)
        parts = []
        for n, candidate in enumerate(candidates):
            parts.append(f"{n}: {candidate.pattern}")
            parts += [f"    {_CONTROL.sub(' ', messages[i])}" for i in sorted(candidate.covers)[:3]
                      if 0 <= i < len(messages)]
        chat = [Message("system", prompts.render("log_agent_system")),
                Message("user", prompts.render("log_agent_judge", nonce=nonce, candidates="\n".join(parts)))]
        try:
            reply = parse_reply(self.llm.complete(chat, temperature=0.0, max_tokens=64), JudgeReply)
        except (ModelBehaviorError, LLMUnavailable):
            return None
        return reply.choice if 0 <= reply.choice < len(candidates) else None


def _claim(item: int | str, index: dict[str, int], size: int) -> int:
    if isinstance(item, int):
        return item if 0 <= item < size else -1
    return index.get(item, -1)
