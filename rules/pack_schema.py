"""What a rule pack may hold, as pydantic models: the one check for the built-in packs
(rules/packs/*/*.yaml) and for the packs `faultline rules export` writes and import reads.

An unknown key is an error naming it (a misspelt `counter_example` would otherwise drop the
counter-examples without a word), and so is a reason outside the taxonomy or a tier, origin
or action that does not exist. `python -m rules.pack_schema` writes the models' JSON Schema to
rules/packs/schema.json, which the packs name in their first line so that an editor with a
YAML language server checks a pack while it is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from rules.model import Tier
from rules.taxonomy import REASONS, Action, Origin

SCHEMA_FILE = Path(__file__).parent / "packs" / "schema.json"
RULE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
"""A rule's id: it is also a path segment of the admin API and page."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Example(_Strict):
    """A line seen in a real log, with where it was seen."""

    line: str = Field(min_length=1)
    source: str | None = Field(None, description="The URL of the thread or file the line comes from.")


class _Rule(_Strict):
    id: str = Field(pattern=f"^{RULE_ID_PATTERN}$")
    description: str = ""
    scope: str | None = Field(None, description="`global`, `framework:<name>` or `family:<name>`; "
                                                "a filter pack's own `scope` when missing.")
    source: str | None = Field(None, description="Who wrote the rule: `builtin`, `log_agent:<backend>`, `import`.")
    status: str | None = Field(None, description="Written by an export; an import decides the status itself.")
    examples: list[str | Example] = Field(default_factory=list,
                                          description="Lines the rule must match (checked on load and import).")
    counter_examples: list[str] = Field(default_factory=list, description="Lines the rule must not match.")

    def example_lines(self) -> tuple[str, ...]:
        return tuple(e.line if isinstance(e, Example) else e for e in self.examples)


class FilterRuleSpec(_Rule):
    """Drops a routine line: `pattern` must match the whole message (the line after its
    launcher's envelope)."""

    kind: Literal["filter"] = "filter"
    pattern: str = Field(min_length=1)
    event: Literal["completed"] | None = Field(None, description="`completed`: the line marks the normal end of training.")


class DiagnosisRuleSpec(_Rule):
    """Names a root cause: any of `patterns` found in a message gives `reason`."""

    kind: Literal["diagnosis"] = "diagnosis"
    reason: Literal[tuple(REASONS)]  # type: ignore[valid-type]  # the taxonomy's ids, an enum in the schema
    tier: Tier = Tier.CAUSE
    patterns: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    origin: Origin | None = Field(None, description="The reason's own origin when missing.")
    action: Action | None = Field(None, description="The reason's own action when missing; never `stop`.")
    mitigation: str = ""

    @model_validator(mode="before")
    @classmethod
    def _one_pattern(cls, data: Any) -> Any:
        # `pattern: X` is accepted for `patterns: [X]`, as a filter rule writes it
        if isinstance(data, dict) and "pattern" in data and "patterns" not in data:
            data = {**data, "patterns": [data["pattern"]]}
            del data["pattern"]
        return data

    @field_validator("action")
    @classmethod
    def _not_stop(cls, action: Action | None) -> Action | None:
        if action is Action.STOP:
            raise ValueError("`stop` is the restart budget's action, not a rule's")
        return action


def _kind(item: Any) -> str:
    """A rule's kind: as it says, else a diagnosis rule when it names a reason."""
    if isinstance(item, dict):
        return str(item.get("kind") or ("diagnosis" if "reason" in item else "filter"))
    return str(getattr(item, "kind", "filter"))


AnyRule = Annotated[Annotated[FilterRuleSpec, Tag("filter")] | Annotated[DiagnosisRuleSpec, Tag("diagnosis")],
                    Discriminator(_kind)]


class Pack(_Strict):
    """A YAML rule pack: built-in (rules/packs) or exported by `faultline rules export`."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="Faultline rule pack")
    scope: str = Field("global", description="The scope of the pack's rules that name none.")
    format: str | None = Field(None, description="Written by an export.")
    exported_at: str | None = None
    filter: dict[str, str] | None = Field(None, description="What an export selected.")
    rules: list[AnyRule]


def problems(exc: ValidationError, data: Any = None) -> list[str]:
    """pydantic's errors as a person reads them: `rule 3 (nccl.x): counter_example: not a
    field`. `data` (the validated document) lends each rule its id."""
    out = []
    rules = data.get("rules") if isinstance(data, dict) else None
    for error in exc.errors(include_url=False):
        loc = list(error["loc"])
        where = ""
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
            index = loc[1]
            rule_id = rules[index].get("id") if isinstance(rules, list) and isinstance(rules[index], dict) else None
            where = f"rule {index + 1}" + (f" ({rule_id})" if rule_id else "") + ": "
            loc = [part for part in loc[2:] if part not in ("filter", "diagnosis")]
        field = ".".join(str(part) for part in loc)
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "not a field of a rule"
        elif error["type"] == "literal_error" and loc == ["reason"]:
            message = f"unknown reason {error['input']!r} (see the taxonomy)"
        out.append(f"{where}{field + ': ' if field else ''}{message}")
    return out


def json_schema() -> dict[str, Any]:
    schema = Pack.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    sys.stderr.write(f"wrote {SCHEMA_FILE}\n")
