"""The verdict, in one place: from what the classifier, the progress tracker and the launcher
traces found, the job's status and root cause (`decide`), whether the Failure Agent is asked
(`needs_agent`) and what its answer may replace (`agent_may_replace`); and the Diagnosis in
the contract's JSON shape (DESIGN.md, "Diagnosis (JSON)"). Which co-occurring error is the
root cause is `rules/rootcause.py`'s evidence policy, which `decide` applies."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rules.anomaly import Spike
from rules.classifier import RuleEvidence, render_mitigation
from rules.model import TIER_RANK, Evidence, KeptLine, Tier
from rules.progress import Checkpoint
from rules.rootcause import OtherError, RootCause, choose_root_cause
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
    if action is Action.CORDON_AND_RESTART and not nodes:
        # nothing to cordon: a scheduler hook cannot drain "the node that reported it", and a
        # plain restart may land on the same machine; the log must be read for the node first
        action = Action.INVESTIGATE
        where = f"rank {ev.rank}" if ev.rank is not None else "the rank that reported it"
        mitigation += f" The log does not name the node: find the host of {where} (the scheduler's task map) and cordon it."
    view = RootCauseView(
        reason=rule.reason, category=taxonomy.category.value if taxonomy.category else None,
        origin=rule.origin.value, line=ev.line, line_number=ev.line_number, file=ev.source,
        rank=ev.rank, node=ev.node, confidence=root.confidence, source=rule_source(rule.id),
    )
    return view, action.value, nodes, mitigation


def other_errors_view(others: list[OtherError]) -> list[dict[str, Any]]:
    return [{"reason": o.reason, "line": o.line, "line_number": o.line_number, "count": o.count,
             "rule": o.rule_id, "file": o.source, **({"survived": True} if o.survived else {})} for o in others]


def _survived(facts: Facts) -> list[OtherError]:
    """The errors training went on past, each at its last match."""
    out = []
    for rule_id in sorted(facts.survived):
        f = facts.found[rule_id]
        last = f.latest
        if f.rule.tier is not Tier.CONTEXT and last is not None:
            out.append(OtherError(f.rule.reason, last.line, last.line_number, f.count, rule_id, last.source,
                                  survived=True))
    return out


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
            "nan": "the loss became NaN/inf", "loss_scale": "the fp16 loss scale collapsed",
            "grad_norm": "the gradient norm exploded"}[spike.kind]
    span = ""
    if spike.kind in ("diverged", "grad_norm") and spike.peak:
        span = f" (from about {spike.baseline:.3g} to {spike.peak:.3g})" if spike.baseline else f" (to {spike.peak:.3g})"
    mitigation = (f"At step {spike.step if spike.step is not None else '?'} {what}{span}"
                  + (f". Roll back to the checkpoint of step {rollback_to.step}" if rollback_to
                     else ". Roll back to the last checkpoint before the spike")
                  + (f" and skip the data of steps {skip[0]}-{skip[1]}" if skip else "")
                  + "; lower the learning rate or tighten gradient clipping if it happens again.")
    view = RootCauseView(
        reason="loss_spike", category=taxonomy.category.value if taxonomy.category else None,
        origin=Origin.TRAINING.value, line=spike.line, line_number=spike.line_number, file=source,
        rank=None, node=None, confidence=0.8 if spike.kind in ("diverged", "grad_norm") else 0.9, source="progress",
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


# -- the decision ------------------------------------------------------------------------------------
HangFinder = Callable[[], "tuple[RootCauseView, str] | None"]
StopFinder = Callable[[], "tuple[str, int, str] | None"]
"""The last line of an ended log: (text, line number, source)."""


@dataclass(frozen=True)
class Facts:
    """What a job's run knows when asked for its verdict (`rules.job.JobRun` gathers it)."""

    found: Mapping[str, RuleEvidence]
    """What the diagnosis rules matched, by rule id."""
    spike: Spike | None
    """A loss spike the metrics of the primary source show."""
    checkpoints: list[Checkpoint]
    progress_source: str | None
    hang: HangFinder
    """The post-hoc hang, if the log shows one: looked for only where it matters."""
    node_of: Callable[[Evidence], str | None]
    traceback: bool
    """A Python traceback was seen."""
    failure_traced: bool
    """A traceback, an exception line or a launcher's failure trace was seen."""
    failure_line: KeptLine | None
    """The line to name when no rule knows the failure: the last exception line, else the
    first fatal-looking line that no progress followed."""
    fatal: bool
    """A fatal-looking line that no progress followed (see `rules.job`)."""
    killed_line: KeptLine | None
    """A process was killed with SIGKILL and the job's own code raised nothing."""
    completed: bool
    """The log says training ended normally."""
    survived: frozenset[str] = frozenset()
    """Rules in `found` that training went on past (see `rules.job.SURVIVED_STEPS`): other
    errors, never the root cause."""
    stopped: StopFinder = lambda: None
    """For a log that has ended (not a live job so far): its last line, where a job that
    never reached a training step and shows no error stopped (see `decide`)."""
    last_error_like: KeptLine | None = None
    """For a log that has ended: its last error-like line, when no rule knew one."""
    bus_error_line: KeptLine | None = None
    """A process was killed with SIGBUS and the job's own code raised nothing."""
    interrupted: tuple[str, int, str] | None = None
    """The last line before someone pressed Ctrl+C (rules.interrupt): (text, number, source)."""
    progress: dict[str, Any] = field(default_factory=dict)
    compression: dict[str, Any] = field(default_factory=dict)
    filtered: list[dict[str, Any]] = field(default_factory=list)


def decide(facts: Facts) -> Diagnosis:
    """Status and root cause, by precedence: a loss spike the metrics saw before what killed
    the job; a cancellation long after progress stopped is a hang; the rules' root cause;
    a spike alone; SIGKILL or SIGBUS with no exception of the job's own; a failure no rule
    knows (never silent); a clean end; a hang; for a whole log with no training step, its
    error-like line no rule knows, else a stall at its last line; running. What training went
    on past is among the other errors (`survived: true`), never the root cause."""
    found = {rule_id: f for rule_id, f in facts.found.items() if rule_id not in facts.survived}
    root, others = choose_root_cause(found)
    spike = facts.spike
    diagnosis = Diagnosis(status=JobStatus.RUNNING.value, root_cause=None, action="none", mitigation="",
                          progress=facts.progress, compression=facts.compression, filtered=facts.filtered)
    diagnosis.other_errors = other_errors_view([*others, *_survived(facts)])
    if root is not None and spike is not None and (root.rule.reason == "loss_spike"
                                                    or TIER_RANK[root.rule.tier] <= TIER_RANK[Tier.SYMPTOM]):
        # the metrics saw the loss go first: the NaN check or the kill that followed is its
        # consequence, and the spike's own line is the earliest evidence
        view, mitigation, rollback = from_spike(spike, facts.checkpoints, facts.progress_source)
        diagnosis.status, diagnosis.root_cause, diagnosis.action = JobStatus.FAILED.value, view, "rollback_and_skip"
        diagnosis.mitigation, diagnosis.rollback = mitigation, rollback
        return diagnosis
    if root is not None and root.rule.reason == "job_cancelled" and spike is None:
        hang = facts.hang()
        if hang is not None:
            # progress had stopped long before the scheduler (or a person) ended the job: the
            # cancellation is how the hang ended, not why the job was lost
            diagnosis.status, diagnosis.action = JobStatus.FAILED.value, "restart"
            diagnosis.root_cause, diagnosis.mitigation = hang
            _also_seen(diagnosis, root)
            return diagnosis
    if facts.interrupted is not None and spike is None and not facts.progress.get("points") and (
            root is None or root.rule.reason == "job_cancelled"):
        # interrupted by hand before any training step, with no error of its own: it sat still
        return _interrupted(diagnosis, facts.interrupted, root)
    if root is not None:
        node = facts.node_of(root.evidence)
        if node is not None and root.evidence.node is None:
            root = replace(root, evidence=replace(root.evidence, node=node), nodes=tuple(sorted({*root.nodes, node})))
        view, action, nodes, mitigation = from_rule(root, others)
        if (view.reason in SETUP_SENSITIVE and view.origin == Origin.INFRASTRUCTURE.value
                and not facts.progress.get("points") and not _past_setup(root)):
            view, action, nodes, mitigation = _before_training(view, mitigation)
        diagnosis.status, diagnosis.root_cause, diagnosis.action = JobStatus.FAILED.value, view, action
        diagnosis.suspect_nodes, diagnosis.mitigation = nodes, mitigation
        if root.rule.reason == "loss_spike" and spike is not None:
            diagnosis.rollback = from_spike(spike, facts.checkpoints, facts.progress_source)[2]
        return diagnosis
    if spike is not None:
        view, mitigation, rollback = from_spike(spike, facts.checkpoints, facts.progress_source)
        diagnosis.root_cause, diagnosis.action = view, "rollback_and_skip"
        diagnosis.mitigation, diagnosis.rollback = mitigation, rollback
        # a traceback after the spike ended the job; without one it may still be training
        diagnosis.status = JobStatus.FAILED.value if facts.traceback else JobStatus.RUNNING.value
        return diagnosis
    if facts.killed_line is not None:
        return _killed(diagnosis, facts.killed_line)
    if facts.bus_error_line is not None:
        return _bus_error(diagnosis, facts.bus_error_line)
    if facts.failure_traced:
        return _unknown_failure(diagnosis, facts.failure_line, found)
    if facts.completed:
        diagnosis.status = JobStatus.HEALTHY.value
        return diagnosis
    if facts.fatal:
        return _unknown_failure(diagnosis, facts.failure_line, found)
    hang = facts.hang()
    if hang is not None:
        diagnosis.status = JobStatus.STALLED.value
        diagnosis.root_cause, diagnosis.mitigation = hang
        diagnosis.action = "restart"
        return diagnosis
    if not facts.progress.get("points"):
        # A whole log with no completion and not one training step is not a job "running
        # mid-training". With an error-like line no rule knows, that line is the best lead
        # (a storage client's retried read timeouts): the agent is asked about it.
        if facts.last_error_like is not None:
            return _unknown_failure(diagnosis, facts.last_error_like, found)
        stopped = facts.stopped()
        if stopped is not None:
            # With no error at all it stopped in its setup (the first collective after NCCL's
            # init, a data or model load, the first train step): how a hang that no watchdog
            # ended looks when its log is posted (each of the 5 dev-split logs that end so).
            _stalled_at(diagnosis, stopped, (
                "The log ends here, before any training step, with no error. If the job is still alive and prints "
                "nothing more, it hangs at this point: dump the stacks of its ranks (py-spy dump --pid) to see which "
                "collective or load waits, then restart from the last checkpoint."))
    return diagnosis


_JIT_BUILD = re.compile(
    r"compiling and loading fused kernels|Emitting ninja build file |Building extension module |"
    r"Allowing ninja to set a default number of workers|as PyTorch extensions root|Lock file exists in build directory")
"""A kernel build at start-up: Megatron's fused kernels, torch.utils.cpp_extension's JIT build
(DeepSpeed's ops, apex). When the output stops on one, the build waits on the lock file that
an interrupted earlier build left behind (torch's FileBaton waits for it forever)."""


def _stalled_at(diagnosis: Diagnosis, at: tuple[str, int, str], mitigation: str) -> Diagnosis:
    """Stalled at a line of the log's own output (before any training step), to investigate."""
    line, line_number, source = at
    view, _ = from_hang(line, line_number, source, None, since="output")
    if _JIT_BUILD.search(line):
        view = replace(view, origin=Origin.USER.value)
        mitigation = (
            "It stopped in a kernel build at start-up, which most often waits for the lock of an earlier build that "
            "was interrupted: delete the build directory (Megatron's megatron/fused_kernels/build, or the PyTorch "
            "extensions root, ~/.cache/torch_extensions by default, TORCH_EXTENSIONS_DIR when set) and restart; give "
            "each node its own extensions directory when it is on a shared filesystem. " + mitigation)
    diagnosis.status, diagnosis.action = JobStatus.STALLED.value, Action.INVESTIGATE.value
    diagnosis.root_cause, diagnosis.mitigation = replace(view, confidence=0.5), mitigation
    return diagnosis


def _also_seen(diagnosis: Diagnosis, root: RootCause) -> None:
    """The rules' root cause, demoted to the first of the other errors."""
    ev = root.evidence
    diagnosis.other_errors = [{"reason": root.rule.reason, "line": ev.line, "line_number": ev.line_number,
                               "count": root.count, "rule": root.rule.id, "file": ev.source}, *diagnosis.other_errors]


def _interrupted(diagnosis: Diagnosis, before: tuple[str, int, str], root: RootCause | None) -> Diagnosis:
    """A stall that a person ended with Ctrl+C: the line before the interrupt is where."""
    _stalled_at(diagnosis, before, (
        "The job was interrupted by hand (Ctrl+C) after this line, before any training step, with no error: it sat "
        "still here. The interrupt's traceback, if printed, shows the call it waited in (a collective, a data or "
        "model load, a kernel build that waits on a stale lock: delete the build directory); otherwise dump the "
        "stacks of its ranks (py-spy dump --pid) while it waits, then restart."))
    if root is not None:
        _also_seen(diagnosis, root)
    return diagnosis


SETUP_SENSITIVE = frozenset({"connection_error", "nccl_timeout"})
"""Failures whose origin depends on when they happen. In public threads a rendezvous, store
or socket failure, or an NCCL timeout, with no training step before it was most often the
job's own setup (a wrong master address or interface, a port in use, containers that cannot
see each other, rank 0 still preparing data while the others wait): 14 of 16 such dev-split
logs with a known origin. Once the job has trained, the same line more often means a peer or
the network went away, and the rule's infrastructure origin stands."""


PAST_SETUP_SEQ = 1000
"""A collective's sequence number from which the job was past its setup: NCCL's watchdog names
the one that timed out (`WorkNCCL(SeqNum=12029440, ...)`), and set-up runs a few dozen; a
paste that shows no training step can still show that thousands came before."""


def _past_setup(root: RootCause) -> bool:
    seq = root.evidence.groups.get("seq")
    return seq is not None and seq.isdigit() and int(seq) >= PAST_SETUP_SEQ


def _before_training(view: RootCauseView, mitigation: str) -> tuple[RootCauseView, str, list[str], str]:
    """The origin and advice of a setup-sensitive failure that came before any training step."""
    view = replace(view, origin=Origin.USER.value)
    mitigation = ("No training step was logged before it: the job's setup is the likely cause, not a node. "
                  + ("Check the master address and port, the network interface (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) "
                     "and that every node and container can reach the others; " if view.reason == "connection_error" else
                     "Look for a rank that was still busy (data preparation or a download on rank 0, a much slower "
                     "first step) or that took another code path, and raise the timeout for long set-up work; ")
                  + "if the setup is right, " + mitigation[:1].lower() + mitigation[1:])
    return view, Action.FIX_AND_RESUBMIT.value, [], mitigation


KILLED_CONFIDENCE = 0.5
"""Evidence by absence (no error of the job's own): good enough to act on, not to be sure;
below CONFIDENT, so the Failure Agent may still name a stronger cause."""


def _killed(diagnosis: Diagnosis, line: KeptLine) -> Diagnosis:
    """SIGKILL with no exception of the job's own: most often the kernel's OOM killer (the
    host ran out of RAM), since a process cannot catch SIGKILL to report anything."""
    taxonomy = reason("out_of_memory")
    diagnosis.status, diagnosis.action = JobStatus.FAILED.value, Action.FIX_AND_RESUBMIT.value
    diagnosis.root_cause = RootCauseView(
        reason="out_of_memory", category=taxonomy.category.value if taxonomy.category else None,
        origin=Origin.USER.value, line=line.text, line_number=line.line_number, file=line.source,
        rank=None, node=None, confidence=KILLED_CONFIDENCE, source="evidence:sigkill")
    diagnosis.mitigation = (
        "A process was killed with SIGKILL (exit code -9 or 137) and raised no error of its own: most often "
        "the kernel's OOM killer, because the host ran out of RAM (DataLoader workers, CPU offload, loading a "
        "checkpoint on every rank). Check `dmesg` or `journalctl -k` on the node for 'Out of memory: Killed "
        "process', then lower host memory use (fewer workers, smaller prefetch, load on one rank) or ask the "
        "scheduler for more memory. If the kernel log shows no OOM kill, look for who sent the signal "
        "(the scheduler's memory limit, a watchdog).")
    return diagnosis


def _bus_error(diagnosis: Diagnosis, line: KeptLine) -> Diagnosis:
    """SIGBUS with no exception of the job's own: shared memory ran out (PyTorch maps tensors
    shared between processes, DataLoader batches and NCCL's SHM transport, as files in
    /dev/shm, and a write past what it can hold is a bus error, not an exception)."""
    diagnosis = _killed(diagnosis, line)
    diagnosis.root_cause = replace(diagnosis.root_cause, source="evidence:sigbus")
    diagnosis.mitigation = (
        "A process was killed with SIGBUS (exit code -7) and raised no error of its own: in training this is "
        "almost always shared memory (/dev/shm) running out, which PyTorch's DataLoader workers and NCCL's "
        "shared-memory transport write to. Give the job more shared memory (docker --shm-size, a Kubernetes "
        "emptyDir with medium: Memory, the node's /dev/shm size) or use fewer DataLoader workers; check "
        "`df -h /dev/shm` on the node while it runs.")
    return diagnosis


ERROR_FILE_RULE = "context.elastic-error-file"
MAX_ERROR_FILES_NAMED = 3


def _unknown_failure(diagnosis: Diagnosis, line: KeptLine | None, found: Mapping[str, RuleEvidence]) -> Diagnosis:
    diagnosis.status = JobStatus.FAILED.value
    diagnosis.action, diagnosis.mitigation = nothing_found(JobStatus.FAILED)
    kept = found.get(ERROR_FILE_RULE)
    paths = list(dict.fromkeys(e.groups["error_file"] for e in kept.items if "error_file" in e.groups)) if kept else []
    if paths:
        # the worker's own exception is in a file torchrun kept (the log has only its exit
        # code): that file, not the log, answers the question
        named = ", ".join(paths[:MAX_ERROR_FILES_NAMED]) + (" and others" if len(paths) > MAX_ERROR_FILES_NAMED else "")
        diagnosis.mitigation = (f"torchrun kept the failed worker's exception in {named}: diagnose again with "
                                f"--error-file {paths[0]}. "
                                + diagnosis.mitigation)
    if line is not None:
        diagnosis.root_cause = RootCauseView(
            reason="unknown", category=None, origin="unknown", line=line.text, line_number=line.line_number,
            file=line.source, rank=None, node=None, confidence=0.0, source="unmatched")
    return diagnosis


def needs_agent(diagnosis: Diagnosis) -> bool:
    """The Failure Agent is asked when the job failed and the rules named no cause, or named
    one without confidence."""
    root = diagnosis.root_cause
    if diagnosis.status != JobStatus.FAILED.value:
        return False
    return root is None or root.reason == "unknown" or root.confidence < CONFIDENT


def agent_may_replace(root: RootCauseView | None, rule_tier: Tier | None, line: str, reason_id: str,
                      tier: Tier, *, error_like: bool = True) -> bool:
    """Whether an agent's answer (`line`, `reason_id` at `tier`) may replace the root cause
    the rules named (`rule_tier`: the tier of the rule behind it, when known).

    The agent is asked because the rules' answer is weak (a symptom such as an NCCL timeout,
    a generic error with a rival), not because it is wrong: it replaces that answer only with
    a line of a stronger tier than the rules' own line, and at least a recognised cause. A
    line the knowledge base only loosely recognises (generic) never overrides a rule.
    A signal that killed the job with no exception of its own (`evidence:`) stands as a
    cause-tier rule does: the launcher's report of that exit is not another failure, and
    the nearest incidents of that very line do not relabel it (they are other exits of the
    same launcher: the embedding cannot tell `return code = -9` from `= 1`). A line
    that says nothing of an error by its own words (`error_like`: a wrapped line's tail, a
    config echo) replaces no named root cause, however near an incident it retrieves.
    """
    if root is None or root.reason == "unknown":
        return True
    if not error_like and line != root.line:
        return False
    if rule_id_of(root.source) is None and not root.source.startswith("evidence:"):
        return True
    if line == root.line and not root.source.startswith("evidence:"):
        return True
    rule_rank = TIER_RANK[rule_tier] if rule_tier is not None else TIER_RANK[Tier.CAUSE]
    rank = TIER_RANK[tier]
    if reason_id == root.reason:
        return rank >= rule_rank  # it agrees, and may name another occurrence (another rank's line)
    return rank > rule_rank and rank >= TIER_RANK[Tier.CAUSE]
