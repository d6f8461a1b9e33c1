"""A restart budget: the same root cause in consecutive attempts of one job, with no training
progress between them, ends in `stop` rather than another restart.

Attempts of one job share an `external_id` (the scheduler's job id, the sidecar's job key).
Users of other systems report what happens without a budget: a hang restarted every half
hour for days, 44 reruns of one NaN failure. A job that trained further between two
failures is making its way, and its count starts again. Pure: diagnoses in (the JSON
contract's dicts), a diagnosis out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_BUDGET = 3
_NODE_BOUND = frozenset({"ecc_error", "nvlink_error", "node_failure", "cuda_error", "network_error"})
"""Reasons that belong to a machine: the same error on another node is another cause."""
CORDON_ON_REPEAT = frozenset({"cuda_error"})
"""A failed CUDA kernel alone is restarted, not cordoned (most often the model's own bad
access); the same error from the same node in the attempt before is evidence of that GPU."""


@dataclass(frozen=True)
class Attempt:
    reason: str | None
    node: str | None
    last_step: int | None
    failed: bool

    @classmethod
    def of(cls, diagnosis: Mapping[str, Any]) -> Attempt:
        root = diagnosis.get("root_cause") or {}
        step = (diagnosis.get("progress") or {}).get("last_step")
        return cls(reason=root.get("reason"), node=root.get("node"),
                   last_step=int(step) if isinstance(step, (int, float)) else None,
                   failed=diagnosis.get("status") == "failed")

    def cause(self) -> tuple[str | None, str | None]:
        return self.reason, self.node if self.reason in _NODE_BOUND else None


def progressed(newer: Attempt, older: Attempt) -> bool:
    """Whether the newer attempt trained beyond the older one."""
    if newer.last_step is None:
        return False
    return older.last_step is None or newer.last_step > older.last_step


def recurrence(current: Attempt, earlier: Sequence[Attempt]) -> int:
    """How many consecutive attempts, this one included, ended in the same root cause with no
    progress between them. `earlier`: the job's previous attempts, newest first."""
    if not current.failed or current.reason in (None, "unknown"):
        return 0
    count, newer = 1, current
    for older in earlier:
        if not older.failed or older.cause() != current.cause() or progressed(newer, older):
            break
        count, newer = count + 1, older
    return count


def repeated_on_its_node(current: Attempt, earlier: Sequence[Attempt]) -> bool:
    """The last failed attempt before this one ended in the same device error on the same
    node (progress between them or not: a bad GPU lets a job train for a while)."""
    if not current.failed or current.reason not in CORDON_ON_REPEAT or current.node is None:
        return False
    last = next((a for a in earlier if a.failed), None)
    return last is not None and last.cause() == current.cause()


def apply_budget(diagnosis: dict[str, Any], earlier: Sequence[Mapping[str, Any]],
                 budget: int = DEFAULT_BUDGET) -> dict[str, Any]:
    """The diagnosis with `attempt` and `recurrence` added; `cordon_and_restart` for a device
    error that the attempt before had on the same node; and `action: stop` once the same
    cause has recurred `budget` times in a row without progress."""
    current = Attempt.of(diagnosis)
    before = [Attempt.of(d) for d in earlier]
    count = recurrence(current, before)
    out = {**diagnosis, "attempt": len(earlier) + 1, "recurrence": count}
    if diagnosis.get("action") == "restart" and repeated_on_its_node(current, before):
        out["action"], out["suspect_nodes"] = "cordon_and_restart", [current.node]
        out["mitigation"] = (
            f"The attempt before this one ended in the same {current.reason} on {current.node}: a fault of that "
            f"GPU or node rather than of the code. Cordon {current.node} (run dcgmi diag -r 3 there) and restart "
            "elsewhere. " + (diagnosis.get("mitigation") or ""))
    if count >= budget and diagnosis.get("action") not in ("none", "stop"):
        where = f" on {current.node}" if current.cause()[1] else ""
        out["action"] = "stop"
        out["mitigation"] = (
            f"Stop restarting: the last {count} attempts of this job all ended in {current.reason}{where} with no "
            f"training progress between them (restart budget {budget}), so another restart would fail the same "
            "way. Fix the cause first. " + (diagnosis.get("mitigation") or ""))
    return out
