"""Loads rule packs (YAML data files), checked by rules.pack_schema, into rule objects: the
built-in packs (through `rules.builtin`, which keeps the result cached) and imported ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from rules.model import DiagnosisRule, FilterRule
from rules.pack_schema import DiagnosisRuleSpec, FilterRuleSpec, Pack, problems
from rules.taxonomy import reason

Spec = TypeVar("Spec", FilterRuleSpec, DiagnosisRuleSpec)


class PackError(ValueError):
    """A rule pack file is malformed."""


def _checked(model: type[Spec], data: Any, what: str) -> Spec:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        rule_id = data.get("id", "?") if isinstance(data, dict) else "?"
        raise PackError(f"{what} {rule_id!r}: " + "; ".join(problems(exc))) from None


def filter_rule_from_dict(data: dict[str, Any], *, scope: str = "global", source: str = "builtin",
                          trusted: bool = True) -> FilterRule:
    return filter_rule_from_spec(_checked(FilterRuleSpec, data, "filter rule"), scope=scope, source=source,
                                 trusted=trusted)


def filter_rule_from_spec(spec: FilterRuleSpec, *, scope: str = "global", source: str = "builtin",
                          trusted: bool = True) -> FilterRule:
    return FilterRule(id=spec.id, pattern=spec.pattern, description=spec.description.strip(),
                      scope=spec.scope or scope, source=spec.source or source, trusted=trusted,
                      examples=spec.example_lines(), event=spec.event)


def diagnosis_rule_from_dict(data: dict[str, Any], *, source: str = "builtin") -> DiagnosisRule:
    return diagnosis_rule_from_spec(_checked(DiagnosisRuleSpec, data, "diagnosis rule"), source=source)


def diagnosis_rule_from_spec(spec: DiagnosisRuleSpec, *, scope: str = "global", source: str = "builtin") -> DiagnosisRule:
    default = reason(spec.reason)
    return DiagnosisRule(
        id=spec.id, reason=spec.reason, tier=spec.tier, patterns=tuple(spec.patterns),
        origin=spec.origin or default.origin, action=spec.action or default.action,
        mitigation=spec.mitigation.strip(), description=spec.description.strip(),
        scope=spec.scope or scope, source=spec.source or source,
        examples=spec.example_lines(), counter_examples=tuple(spec.counter_examples),
    )


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML was built with it (its wheels are): the packs parse ten
times faster, a third of a short log's `diagnose` otherwise; the same documents either way."""


class StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping: YAML keeps the last one
    silently, and a pack entry with two `caseless:` or two `pattern:` lines loses one. The
    admin's import loads with it; a test holds the built-in packs to it (the packs themselves
    load with SAFE_LOADER, for speed)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_pack(path: Path) -> Pack:
    """A pack file, checked against the pack schema (rules.pack_schema)."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise PackError(f"{path.name}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise PackError(f"{path.name}: expected a mapping with a 'rules' list")
    try:
        return Pack.model_validate(data)
    except ValidationError as exc:
        raise PackError(f"{path.name}: " + "; ".join(problems(exc, data))) from None


def load_filter_pack(path: Path) -> list[FilterRule]:
    pack = load_pack(path)
    return [filter_rule_from_spec(_as(FilterRuleSpec, rule, path), scope=pack.scope) for rule in pack.rules]


def load_diagnosis_pack(path: Path) -> list[DiagnosisRule]:
    return [diagnosis_rule_from_spec(_as(DiagnosisRuleSpec, rule, path)) for rule in load_pack(path).rules]


def _as(model: type[Spec], rule: FilterRuleSpec | DiagnosisRuleSpec, path: Path) -> Spec:
    if not isinstance(rule, model):
        wanted = model.model_fields["kind"].default
        raise PackError(f"{path.name}: rule {rule.id!r} is a {rule.kind} rule, in a folder of {wanted} rules")
    return rule
