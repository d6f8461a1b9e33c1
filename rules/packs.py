"""Loads the built-in rule packs (YAML data files) into rule objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rules.model import DiagnosisRule, FilterRule, Tier
from rules.taxonomy import Action, Origin, is_reason, reason

PACKS_DIR = Path(__file__).parent / "packs"


class PackError(ValueError):
    """A rule pack file is malformed."""


def _examples(raw: Any) -> tuple[str, ...]:
    out = []
    for item in raw or ():
        out.append(item["line"] if isinstance(item, dict) else str(item))
    return tuple(out)


def filter_rule_from_dict(data: dict[str, Any], *, scope: str = "global", source: str = "builtin",
                          trusted: bool = True) -> FilterRule:
    try:
        return FilterRule(
            id=str(data["id"]), pattern=str(data["pattern"]),
            description=str(data.get("description", "")).strip(),
            scope=str(data.get("scope", scope)), source=str(data.get("source", source)),
            trusted=trusted, examples=_examples(data.get("examples")),
            event=data.get("event"),
        )
    except KeyError as exc:
        raise PackError(f"filter rule {data.get('id', '?')!r} lacks {exc}") from None


def diagnosis_rule_from_dict(data: dict[str, Any], *, source: str = "builtin") -> DiagnosisRule:
    rule_id = data.get("id", "?")
    try:
        reason_id = str(data["reason"])
        if not is_reason(reason_id):
            raise PackError(f"diagnosis rule {rule_id!r}: unknown reason {reason_id!r}")
        default = reason(reason_id)
        if data.get("action") == Action.STOP.value:
            raise PackError(f"diagnosis rule {rule_id!r}: `stop` is the restart budget's action, not a rule's")
        patterns = data["patterns"] if "patterns" in data else [data["pattern"]]
        return DiagnosisRule(
            id=str(rule_id), reason=reason_id, tier=Tier(data.get("tier", "cause")),
            patterns=tuple(str(p) for p in patterns),
            origin=Origin(data.get("origin", default.origin)),
            action=Action(data.get("action", default.action)),
            mitigation=str(data.get("mitigation", "") or "").strip(),
            description=str(data.get("description", "") or "").strip(),
            scope=str(data.get("scope", "global")), source=str(data.get("source", source)),
            examples=_examples(data.get("examples")),
            counter_examples=tuple(str(c) for c in data.get("counter_examples") or ()),
        )
    except KeyError as exc:
        raise PackError(f"diagnosis rule {rule_id!r} lacks {exc}") from None
    except ValueError as exc:
        if isinstance(exc, PackError):
            raise
        raise PackError(f"diagnosis rule {rule_id!r}: {exc}") from None


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML was built with it (its wheels are): the packs parse ten
times faster, a third of a short log's `diagnose` otherwise; the same documents either way."""


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise PackError(f"{path.name}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise PackError(f"{path.name}: expected a mapping with a 'rules' list")
    return data


def load_filter_pack(path: Path) -> list[FilterRule]:
    data = _load_yaml(path)
    scope = str(data.get("scope", "global"))
    return [filter_rule_from_dict(item, scope=scope) for item in data["rules"]]


def load_diagnosis_pack(path: Path) -> list[DiagnosisRule]:
    return [diagnosis_rule_from_dict(item) for item in _load_yaml(path)["rules"]]


def builtin_filter_rules(packs_dir: Path = PACKS_DIR) -> list[FilterRule]:
    rules: list[FilterRule] = []
    for path in sorted((packs_dir / "filters").glob("*.yaml")):
        rules.extend(load_filter_pack(path))
    return rules


def builtin_diagnosis_rules(packs_dir: Path = PACKS_DIR) -> list[DiagnosisRule]:
    rules: list[DiagnosisRule] = []
    for path in sorted((packs_dir / "diagnosis").glob("*.yaml")):
        rules.extend(load_diagnosis_pack(path))
    return rules
