"""The diagnosis: assembling what the classifier, the progress tracker and the agents found
into the contract's JSON shape (DESIGN.md, "Diagnosis (JSON)")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rules.anomaly import Spike
from rules.classifier import render_mitigation
from rules.progress import Checkpoint
from rules.rootcause import OtherError, RootCause
from rules.taxonomy import Action, JobStatus, Origin, reason


MAX_SUSPECT_NODES = 8
"""More nodes than this reporting one infrastructure fault is not a node fault."""
CONFIDENT = 0.6
"""A rule's root cause below this confidence is not sure: the Failure Agent is asked (when
one is configured), and the diagnosis is not confirmed into the knowledge base."""
RULE_SOURCE = "rule:"
"""A root cause's `source` when a diagnosis rule named it: `rule:<id>`."""


def rule_source(rule_id: str) -> str:
    return f"{RULE_SOURCE}{rule_id}"


def rule_id_of(source: str | None) -> str | None:
    """The rule id of a root cause's `source`, None when no rule named it."""
    return source[len(RULE_SOURCE):] if source and source.startswith(RULE_SOURCE) else None


@dataclass(frozen=True, slots=True)
class RootCauseView:
    reason: str
    category: str | None
    origin: str
    line: str
    line_number: int
    file: str
    rank: int | None
    node: str | None
    confidence: float
    source: str
    """`rule:<id>`, `failure_agent`, `retrieval`, `progress` (loss spike or hang)."""


@dataclass
class Diagnosis:
    status: str
    root_cause: RootCauseView | None
    action: str
    mitigation: str
    other_errors: list[dict[str, Any]] = field(default_factory=list)
    suspect_nodes: list[str] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    compression: dict[str, Any] = field(default_factory=dict)
    suggested_rules: list[dict[str, Any]] = field(default_factory=list)
    filtered: list[dict[str, Any]] = field(default_factory=list)
    """What the filter rules dropped: rule id, count, first and last line."""
    rollback: dict[str, Any] | None = None
    """For a loss spike: the checkpoint to go back to and the steps to skip."""
    agent: dict[str, Any] | None = None
    rules_to_store: list[dict[str, Any]] = field(default_factory=list, repr=False)
    """Rules the Failure Agent suggested, for the caller to store with the job (not part of
    the JSON: `suggested_rules` says what they are)."""
    """What the Failure Agent did: backend, candidates, nearest incidents, write-back."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("rules_to_store")
        for optional in ("rollback", "agent"):
            if out[optional] is None:
                out.pop(optional)
        return out


def from_rule(root: RootCause, others: list[OtherError]) -> tuple[RootCauseView, str, list[str], str]:
    """The root-cause view, action, suspect nodes and mitigation for a rule-based root cause."""
    ev, rule = root.evidence, root.rule
    taxonomy = reason(rule.reason)
    infra = rule.origin is Origin.INFRASTRUCTURE
    nodes = list(root.nodes) if infra else []
    if infra and ev.node and ev.node not in nodes:
        nodes.insert(0, ev.node)
    values: dict[str, object] = {"node": ev.node or (nodes[0] if nodes else None), "rank": ev.rank,
                                 "file": ev.source, "match": ev.groups.get("match")}
    values.update({f"g_{k}": v for k, v in ev.groups.items()})
    mitigation = render_mitigation(rule.mitigation or taxonomy.mitigation, values)
    action = rule.action
    if len(nodes) > MAX_SUSPECT_NODES:
        # one bad node shows up on one or two nodes; many nodes reporting the same fault point
        # at something they share, and cordoning them all would drain the cluster
        mitigation += (f" The same error came from {len(nodes)} or more nodes: suspect what they share "
                       "(a switch, the fabric, the storage service) rather than the nodes themselves.")
        nodes = []
        if action is Action.CORDON_AND_RESTART:
            action = Action.INVESTIGATE
    view = RootCauseView(
        reason=rule.reason, category=taxonomy.category.value if taxonomy.category else None,
        origin=rule.origin.value, line=ev.line, line_number=ev.line_number, file=ev.source,
        rank=ev.rank, node=ev.node, confidence=root.confidence, source=rule_source(rule.id),
    )
    return view, action.value, nodes, mitigation


def other_errors_view(others: list[OtherError]) -> list[dict[str, Any]]:
    return [{"reason": o.reason, "line": o.line, "line_number": o.line_number, "count": o.count,
             "rule": o.rule_id, "file": o.source} for o in others]


def from_spike(spike: Spike, checkpoints: list[Checkpoint], source: str) -> tuple[RootCauseView, str, dict[str, Any]]:
    """Root cause, mitigation and rollback advice for a loss spike seen in the metrics."""
    taxonomy = reason("loss_spike")
    before = [c for c in checkpoints if spike.step is None or c.step < spike.step]
    rollback_to = before[-1] if before else None
    skip = None
    if spike.step is not None:
        start = rollback_to.step + 1 if rollback_to else max(0, spike.step - 100)
        skip = [start, spike.step + 100]
    what = {"diverged": "the loss jumped and did not come back",
            "nan": "the loss became NaN/inf", "loss_scale": "the fp16 loss scale collapsed"}[spike.kind]
    mitigation = (f"At step {spike.step if spike.step is not None else '?'} {what}"
                  + (f" (from about {spike.baseline:.3g} to {spike.peak:.3g})"
                     if spike.kind == "diverged" and spike.baseline and spike.peak else "")
                  + (f". Roll back to the checkpoint of step {rollback_to.step}" if rollback_to
                     else ". Roll back to the last checkpoint before the spike")
                  + (f" and skip the data of steps {skip[0]}-{skip[1]}" if skip else "")
                  + "; lower the learning rate or tighten gradient clipping if it happens again.")
    view = RootCauseView(
        reason="loss_spike", category=taxonomy.category.value if taxonomy.category else None,
        origin=Origin.TRAINING.value, line=spike.line, line_number=spike.line_number, file=source,
        rank=None, node=None, confidence=0.8 if spike.kind == "diverged" else 0.9, source="progress",
    )
    rollback = {"checkpoint_step": rollback_to.step if rollback_to else None,
                "checkpoint_line": rollback_to.line_number if rollback_to else None,
                "skip_steps": skip, "spike_step": spike.step, "kind": spike.kind}
    return view, mitigation, rollback


def from_hang(line: str, line_number: int, source: str, silent_s: float | None,
              since: str = "progress") -> tuple[RootCauseView, str]:
    """`since`: `progress` (steps stopped; the line is the last progress report) or `output`
    (nothing at all since start-up; the line is the last one printed)."""
    taxonomy = reason("hang")
    view = RootCauseView(
        reason="hang", category=taxonomy.category.value if taxonomy.category else None,
        origin=taxonomy.origin.value, line=line, line_number=line_number, file=source,
        rank=None, node=None, confidence=0.7, source="progress",
    )
    if silent_s is None:
        span = ""
    elif silent_s >= 120:
        span = f" for {silent_s / 60:.0f} minutes"
    else:
        span = f" for {silent_s:.0f} seconds"
    what = ("No training progress" if since == "progress"
            else "No output and no training step yet")
    return view, (f"{what}{span} after this line and no error. " + taxonomy.mitigation)


def nothing_found(status: JobStatus) -> tuple[str, str]:
    """Action and mitigation when no root cause was found."""
    if status is JobStatus.FAILED:
        return Action.INVESTIGATE.value, reason("unknown").mitigation
    return Action.NONE.value, ""
