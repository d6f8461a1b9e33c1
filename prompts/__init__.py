"""Prompt templates, one file each, rendered with `$name` placeholders.

Log text is data: templates put it inside a delimited block of the user message, never in
the system message, and what an agent may do is decided by code, not by the reply.
"""

from __future__ import annotations

import string
from functools import cache
from pathlib import Path

PROMPTS_DIR = Path(__file__).parent


class PromptError(KeyError):
    """A prompt file is missing or a placeholder was not given."""


@cache
def _template(name: str) -> string.Template:
    path = PROMPTS_DIR / f"{name}.txt"
    if not path.is_file():
        raise PromptError(f"no prompt named {name!r} in {PROMPTS_DIR}")
    return string.Template(path.read_text(encoding="utf-8"))


def placeholders(name: str) -> set[str]:
    template = _template(name)
    return {m.group("named") or m.group("braced") for m in template.pattern.finditer(template.template)
            if m.group("named") or m.group("braced")}


def render(name: str, **values: object) -> str:
    """The prompt with every placeholder filled; a missing one is an error, not a blank."""
    template = _template(name)
    try:
        return template.substitute({k: str(v) for k, v in values.items()})
    except KeyError as exc:
        raise PromptError(f"prompt {name!r} needs {exc.args[0]!r}") from None


def names() -> list[str]:
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.txt"))
