"""The restart budget over a job's attempts (rules/attempts.py)."""

from __future__ import annotations

from rules.attempts import apply_budget


def attempt(reason: str | None = "nccl_timeout", *, node: str | None = None, step: int | None = 100,
            status: str = "failed", action: str = "restart") -> dict:
    root = {"reason": reason, "node": node, "line": "x"} if reason else None
    return {"status": status, "root_cause": root, "action": action, "mitigation": "Restart.",
            "progress": {"last_step": step}}


def test_the_same_cause_without_progress_stops_at_the_budget() -> None:
    first = apply_budget(attempt(), [], 3)
    second = apply_budget(attempt(), [attempt()], 3)
    third = apply_budget(attempt(), [attempt(), attempt()], 3)
    assert (first["attempt"], first["recurrence"], first["action"]) == (1, 1, "restart")
    assert (second["attempt"], second["recurrence"], second["action"]) == (2, 2, "restart")
    assert (third["attempt"], third["recurrence"], third["action"]) == (3, 3, "stop")
    assert third["mitigation"].startswith("Stop restarting: the last 3 attempts") and third["mitigation"].endswith("Restart.")


def test_progress_between_failures_starts_the_count_again() -> None:
    # newest first: the attempt before this one reached step 500, the one before it 100
    d = apply_budget(attempt(step=900), [attempt(step=500), attempt(step=100)], 3)
    assert d["recurrence"] == 1 and d["action"] == "restart"
    d = apply_budget(attempt(step=500), [attempt(step=500), attempt(step=100)], 3)
    assert d["recurrence"] == 2


def test_another_cause_or_a_healthy_attempt_breaks_the_run() -> None:
    assert apply_budget(attempt(), [attempt("out_of_memory"), attempt(), attempt()], 3)["recurrence"] == 1
    assert apply_budget(attempt(), [attempt(status="healthy"), attempt(), attempt()], 3)["recurrence"] == 1


def test_a_hardware_cause_counts_per_node() -> None:
    ecc = lambda node: attempt("ecc_error", node=node, action="cordon_and_restart")  # noqa: E731
    assert apply_budget(ecc("node-7"), [ecc("node-3"), ecc("node-5")], 3)["recurrence"] == 1
    assert apply_budget(ecc("node-7"), [ecc("node-7"), ecc("node-7")], 3)["action"] == "stop"


def test_a_cuda_error_again_on_its_node_is_cordoned() -> None:
    cuda = lambda node, step=100: attempt("cuda_error", node=node, step=step)  # noqa: E731
    first = apply_budget(cuda("node-7"), [], 3)
    assert first["action"] == "restart" and "suspect_nodes" not in first
    again = apply_budget(cuda("node-7", step=900), [cuda("node-7", step=400)], 3)
    assert again["action"] == "cordon_and_restart" and again["suspect_nodes"] == ["node-7"]
    assert again["mitigation"].startswith("The attempt before this one ended in the same cuda_error on node-7")
    # another node, no node named, or another error in between: a restart still
    assert apply_budget(cuda("node-7"), [cuda("node-3")], 3)["action"] == "restart"
    assert apply_budget(cuda(None), [cuda(None)], 3)["action"] == "restart"
    assert apply_budget(cuda("node-7"), [attempt("out_of_memory"), cuda("node-7")], 3)["action"] == "restart"
    # and the budget still ends it
    assert apply_budget(cuda("node-7"), [cuda("node-7"), cuda("node-7")], 3)["action"] == "stop"


def test_nothing_to_stop() -> None:
    assert apply_budget(attempt(None, status="healthy", action="none"), [attempt(), attempt()], 3)["action"] == "none"
    assert apply_budget(attempt("unknown"), [attempt("unknown")] * 5, 3)["recurrence"] == 0
