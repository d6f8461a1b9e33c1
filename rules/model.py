"""Plain data types passed between the stages of the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rules.taxonomy import Action, Origin

# Named groups a filter rule may capture from the lines it drops (its "progress fields").
PROGRESS_FIELDS = frozenset({
    "step", "loss", "grad_norm", "step_time_ms", "step_time_s", "loss_scale", "lr",
    "skipped_iters", "nan_iters", "checkpoint_step",
})


class RuleKind(StrEnum):
    FILTER = "filter"
    DIAGNOSIS = "diagnosis"


class RuleStatus(StrEnum):
    ACTIVE = "active"        # built-in, or approved
    PENDING = "pending"      # suggested by an agent, waiting for review
    REJECTED = "rejected"
    DISABLED = "disabled"


class Tier(StrEnum):
    """How strongly a diagnosis rule's line explains a failure (see rules/rootcause.py)."""

    HARDWARE = "hardware"
    NETWORK = "network"
    DEVICE = "device"
    CAUSE = "cause"
    GENERIC = "generic"
    SYMPTOM = "symptom"
    CONTEXT = "context"


TIER_RANK = {
    Tier.HARDWARE: 6, Tier.NETWORK: 5, Tier.DEVICE: 4, Tier.CAUSE: 3,
    Tier.GENERIC: 2, Tier.SYMPTOM: 1, Tier.CONTEXT: 0,
}


@dataclass(frozen=True, slots=True)
class FilterRule:
    id: str
    pattern: str
    """Matches a whole message (the line after its launcher envelope)."""
    description: str = ""
    scope: str = "global"
    """`global`, `framework:<name>` or `family:<name>`."""
    source: str = "builtin"
    """`builtin`, `log_agent:<backend>` or `import`."""
    trusted: bool = True
    """Reviewed by a person. Untrusted patterns are matched only by linear-time engines."""
    examples: tuple[str, ...] = ()
    event: str | None = None
    """`completed` for a line that marks the normal end of training."""


@dataclass(frozen=True, slots=True)
class DiagnosisRule:
    id: str
    reason: str
    tier: Tier
    patterns: tuple[str, ...]
    """Searched anywhere in the message; any one matching is enough."""
    origin: Origin
    action: Action
    mitigation: str = ""
    description: str = ""
    scope: str = "global"
    source: str = "builtin"
    examples: tuple[str, ...] = ()
    counter_examples: tuple[str, ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class KeptLine:
    """A line that survived filtering. Never changed once made (`dataclasses.replace` makes a
    changed copy), yet not `frozen`: a frozen dataclass's __init__ costs four times as much,
    and a log that no rule knows makes one of these per line."""

    line_number: int
    """1-based, within its source."""
    text: str
    error_like: bool
    source: str = ""


@dataclass(slots=True)
class RuleStats:
    """What a filter rule dropped: kept so a compressed log still says what it left out."""

    count: int = 0
    first_line: int = 0
    last_line: int = 0

    def merge(self, other: RuleStats) -> None:
        if other.count == 0:
            return
        if self.count == 0 or other.first_line < self.first_line:
            self.first_line = other.first_line
        self.last_line = max(self.last_line, other.last_line)
        self.count += other.count


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    step: int | None
    loss: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    loss_scale: float | None = None
    line_number: int = 0
    source: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    """An error line matched by a diagnosis rule."""

    rule_id: str
    reason: str
    tier: Tier
    line: str
    line_number: int
    source: str
    seq: int
    """Order of arrival across all sources; breaks ties when no timestamp is known."""
    rank: int | None = None
    node: str | None = None
    timestamp: float | None = None
    """Seconds (epoch or time of day) read from the line, when it carries one."""
    groups: dict[str, str] = field(default_factory=dict)
    chained_from: int | None = None
    """seq of the exception this one was raised from (Python exception chains)."""
