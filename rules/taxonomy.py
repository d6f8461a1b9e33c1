"""The failure taxonomy: fixed reason ids, their category, default origin and action.

The ids, categories and origins are part of the public contract (DESIGN.md); the
default action and mitigation are what a rule inherits when it does not say better.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Category(StrEnum):
    INFRASTRUCTURE = "infrastructure"
    FRAMEWORK = "framework"
    SCRIPT = "script"
    TRAINING = "training"


class Origin(StrEnum):
    """Who has to act: infrastructure (restart on healthy nodes), user (fix code/config/data),
    training (an anomaly of the run itself), unknown."""

    INFRASTRUCTURE = "infrastructure"
    USER = "user"
    TRAINING = "training"
    UNKNOWN = "unknown"


class Action(StrEnum):
    RESTART = "restart"
    CORDON_AND_RESTART = "cordon_and_restart"
    ROLLBACK_AND_SKIP = "rollback_and_skip"
    FIX_AND_RESUBMIT = "fix_and_resubmit"
    INVESTIGATE = "investigate"
    STOP = "stop"
    """Set by the restart budget (rules.attempts), never by a rule."""
    NONE = "none"


class JobStatus(StrEnum):
    FAILED = "failed"
    HEALTHY = "healthy"
    STALLED = "stalled"
    RUNNING = "running"


UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Reason:
    id: str
    category: Category | None
    origin: Origin
    action: Action
    summary: str
    """One line a user reads next to the reason id."""
    mitigation: str
    """What to do when the matching rule has nothing more specific to say."""


_I, _F, _S, _T = Category.INFRASTRUCTURE, Category.FRAMEWORK, Category.SCRIPT, Category.TRAINING
_INFRA, _USER = Origin.INFRASTRUCTURE, Origin.USER
_FIX = Action.FIX_AND_RESUBMIT
_CORDON = Action.CORDON_AND_RESTART

_REASONS = [
    Reason("nvlink_error", _I, _INFRA, _CORDON, "NVLink/NVSwitch fault on a GPU",
           "Cordon the node, run the NVLink/fabric manager checks, restart from the last checkpoint on healthy nodes."),
    Reason("cuda_error", _I, _INFRA, _CORDON, "CUDA driver or device error",
           "Cordon the node that reported it, run a GPU health check (dcgmi diag), restart on healthy nodes."),
    Reason("node_failure", _I, _INFRA, _CORDON, "a node or its GPU dropped out",
           "Drain the failed node in the scheduler and restart the job on healthy nodes from the last checkpoint."),
    Reason("ecc_error", _I, _INFRA, _CORDON, "uncorrectable GPU memory (ECC) error",
           "Cordon the node, reset the GPU or replace it (row remapping pending), restart on healthy nodes."),
    Reason("network_error", _I, _INFRA, _CORDON, "InfiniBand/RoCE or NIC fault",
           "Cordon the node whose NIC reported the error, check the IB link (ibstat, port counters), restart."),
    Reason("connection_error", _I, _INFRA, Action.RESTART, "rendezvous, store or socket connection failed",
           "Check that the master address and port are reachable from every node, then restart."),
    Reason("s3_storage_error", _I, _INFRA, Action.RESTART, "object storage (S3/Ceph) request failed",
           "Check the storage endpoint and credentials; restart once the storage answers again."),
    Reason("nccl_timeout", _I, _INFRA, Action.RESTART, "a collective timed out in the NCCL watchdog",
           "A timeout is usually a symptom: look for the rank that stopped first; restart, and cordon the node if it repeats."),
    Reason("nccl_remote_error", _I, _INFRA, Action.RESTART, "a peer process exited or the network failed under NCCL",
           "Find the peer that died first (its own error comes earlier in the log); restart on healthy nodes."),
    Reason("dataloader_killed", _F, _USER, _FIX, "a DataLoader worker was killed",
           "Lower num_workers or prefetch, raise the container's shared memory (/dev/shm) or host memory limit."),
    Reason("attribute_error", _F, _USER, _FIX, "AttributeError in the training code",
           "Fix the attribute access named in the error (often a version mismatch between code and library)."),
    Reason("out_of_memory", _F, _USER, _FIX, "GPU out of memory",
           "Lower the micro-batch size or sequence length, enable activation checkpointing, or add model parallelism."),
    Reason("runtime_error", _F, _USER, _FIX, "RuntimeError raised by the framework",
           "Read the RuntimeError text: it names the shape, dtype or state that is wrong; fix and resubmit."),
    Reason("assertion_error", _F, _USER, _FIX, "an assertion in the code failed",
           "The assertion names the violated condition (often a config combination); fix it and resubmit."),
    Reason("value_error", _F, _USER, _FIX, "ValueError: a bad value or argument",
           "Fix the value named in the error (config, argument or data) and resubmit."),
    Reason("zero_division_error", _F, _USER, _FIX, "division by zero",
           "A counter or size is zero (empty dataset split, zero steps, zero tokens); fix the config or data."),
    Reason("model_loading_error", _F, _USER, _FIX, "the model or checkpoint could not be loaded",
           "Check the checkpoint path, its completeness and that its parallel layout matches the run's."),
    Reason("dataset_loading_error", _F, _USER, _FIX, "the dataset could not be loaded",
           "Check the dataset path, index files and format; rebuild the index if it is stale."),
    Reason("file_not_found_error", _S, _USER, _FIX, "a file or directory is missing",
           "Create or fix the path named in the error, or mount the volume it lives on."),
    Reason("os_error", _S, _USER, _FIX, "an operating-system call failed",
           "Check the path, disk space and limits named in the error."),
    Reason("type_error", _S, _USER, _FIX, "TypeError in the training code", "Fix the call named in the error."),
    Reason("name_error", _S, _USER, _FIX, "NameError: an undefined name", "Define or import the name named in the error."),
    Reason("permission_error", _S, _USER, _FIX, "permission denied",
           "Fix the permissions or ownership of the path named in the error."),
    Reason("import_error", _S, _USER, _FIX, "a module could not be imported",
           "Install the missing package (or the matching version) in the job's environment."),
    Reason("key_error", _S, _USER, _FIX, "KeyError: a missing key", "Add the key to the config or checkpoint, or fix its name."),
    Reason("syntax_error", _S, _USER, _FIX, "the script does not parse", "Fix the syntax error at the file and line given."),
    Reason("argument_error", _S, _USER, _FIX, "bad command-line arguments",
           "Fix the launch command: the argument named in the error is unknown, missing or invalid."),
    Reason("called_process_error", _S, _USER, _FIX, "a subprocess exited with an error",
           "Run the failing command by hand; its own output says why it failed."),
    Reason("index_error", _S, _USER, _FIX, "IndexError: an index out of range",
           "Fix the indexing named in the error (often a vocabulary or shape mismatch)."),
    Reason("loss_spike", _T, Origin.TRAINING, Action.ROLLBACK_AND_SKIP, "the loss diverged or became NaN",
           "Roll back to the last checkpoint before the spike and skip the data batches around it; lower the LR if it repeats."),
    Reason("hang", _T, Origin.UNKNOWN, Action.RESTART, "the job stopped making progress without an error",
           "Dump the stacks (py-spy dump) of the stuck ranks, then restart from the last checkpoint."),
    Reason("job_cancelled", _T, _USER, Action.RESTART, "the scheduler cancelled the job",
           "Resubmit from the last checkpoint; raise the time limit or save before it (e.g. --exit-duration-in-mins)."),
]

REASONS: dict[str, Reason] = {r.id: r for r in _REASONS}

UNKNOWN_REASON = Reason(UNKNOWN, None, Origin.UNKNOWN, Action.INVESTIGATE, "no known failure could be identified",
                        "Nothing in the log names a known failure; read the last lines of each rank.")


def reason(reason_id: str) -> Reason:
    """The taxonomy entry for an id; `unknown` for the unknown reason. Raises KeyError otherwise."""
    if reason_id == UNKNOWN:
        return UNKNOWN_REASON
    return REASONS[reason_id]


def is_reason(reason_id: str) -> bool:
    return reason_id == UNKNOWN or reason_id in REASONS
