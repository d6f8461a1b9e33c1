"""The loss of a metric line that no filter rule reads: formats no pack knows, in pastes too
short for the Log Agent to learn them.

Trainers without a pack print their loss the same few ways: `loss: L`, `loss=L`, `'loss': L`,
`train/loss:L`, `loss L` (Keras-style progress aligns it: `loss        nan`), a logger's
`[Loss] L`, often after the step (`step: N`, `step:N`, `iter N`). verl prints
`step:N - ... - train/loss:L` (verl/utils/tracking.py), MaxText `completed step: N, seconds:
..., loss: L` (MaxText/metric_logger.py), nanoGPT `iter N: loss L, time ...` (train.py).
Validation losses (`val_loss`, `eval/loss`) are not read: in one series with the training
loss they would look like jumps. `total_loss` is (detectron2's and DINOv2's metric printers
sum their loss terms under that name), and so are RL trainers' policy losses: DeepSpeed-Chat's
`act_loss`, OpenRLHF's `policy_loss`, verl's `actor/pg_loss` (the critic's value loss is not:
one series per line). The gradient norm of a line that reports a loss is
read too (`grad_norm`, `grad norm`, `GradNorm`, `gnorm`): HF Trainer dicts and JSON lines
show a diverged run as `'grad_norm': nan` next to a finite, even 0.0, loss. Once a filter
rule reads a source's progress (a pack, or a template the Log Agent learned with its fields
named), its kept lines are sniffed only for a NaN or inf (rules.progress.observe_kept).

Some loops print the loss with no name at all: a bare `step value` pair (`76980 nan`, a BART
pretraining script) or the loss tensor itself (`tensor(nan, device='cuda:0')`, a LoRA
fine-tuning loop's `print(loss)`). Such a line says too little to be read as a loss by
itself; rules.progress counts it only when its series turns NaN/inf and stays so.
"""

from __future__ import annotations

from rules.envelope import bare_message
from rules.linear import compile_linear, search_groups

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|[Nn][Aa][Nn]|[Ii][Nn][Ff])"
LOSS_LINE = compile_linear(
    r"(?:\b(?:step|iter|iteration)['\"]?(?:: ?|=| )(?P<step>\d+)\b.*?)?"
    r"(?:^|[ \t{,|'\"(\[]|train[/_]|total_|lm_|act_|actor[/_]|policy_|pg_)[Ll]oss(?:['\"]|\])?(?:[:=] ?| +)['\"]?(?P<loss>"
    + _NUMBER + r")(?:[^\w.]|$)")
"""Searched, in RE2 (linear time whatever a line holds)."""
GRAD_NORM = compile_linear(
    r"(?:^|[ \t{,|'\"(]|train/)(?:[Gg]rad[_ ]?[Nn]orm|gnorm)['\"]?(?:[:=] ?| )['\"]?(?P<grad>" + _NUMBER + r")(?:[^\w.]|$)")
"""Not `max_grad_norm` or `clip_grad_norm` (settings, not readings): no `_` before it."""
BARE_LOSS = compile_linear(
    r"^[ \t]*(?:(?P<step>\d+)[ \t]+(?P<value>" + _NUMBER + r")|tensor\((?P<tensor>" + _NUMBER
    + r")(?:, ?device='[\w:]+')?(?:, ?(?:grad_fn=<\w+>|requires_grad=True))?\))[ \t]*$")
"""A whole line that is a step and a number, or a printed scalar tensor."""
_STEP, _LOSS = LOSS_LINE.groupindex["step"] - 1, LOSS_LINE.groupindex["loss"] - 1
_GRAD = GRAD_NORM.groupindex["grad"] - 1


def loss_fields(text: str) -> tuple[str | None, str] | None:
    """(step or None, loss) as printed, when the line reports a training loss."""
    if "oss" not in text:  # most kept lines: no regex at all
        return None
    groups = search_groups(LOSS_LINE, text)
    if groups is None:
        return None
    return groups[_STEP], groups[_LOSS]


def bare_loss(text: str) -> tuple[str | None, str] | None:
    """(step or None, value) as printed, when the whole line is a bare step-value pair or a
    printed scalar tensor."""
    tail = text.rstrip()
    if not _may_be_bare(tail):  # most kept lines: no regex at all
        return None
    groups = search_groups(BARE_LOSS, bare_message(tail))  # after a launcher's or logger's prefix
    if groups is None:
        return None
    step, value, tensor = groups
    return (step, value) if value is not None else (None, tensor)


def _may_be_bare(tail: str) -> bool:
    """A cheap test before the regex: a tensor's closing parenthesis, or a pair's step as the
    word before its value."""
    if tail.endswith(")"):
        return "tensor(" in tail
    words = tail.rsplit(None, 2)
    return len(words) > 1 and words[-2].isdigit()


def grad_norm_field(text: str) -> str | None:
    """The gradient norm as printed, on a line that loss_fields reads."""
    groups = search_groups(GRAD_NORM, text)
    return None if groups is None else groups[_GRAD]
