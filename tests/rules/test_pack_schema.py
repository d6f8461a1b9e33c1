"""The rule packs' schema (rules/pack_schema.py): one check for the built-in packs and for
imported ones, a JSON Schema an editor can use, and errors that name the rule and the key."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest
import yaml

from rules.pack_schema import SCHEMA_FILE, schema_text
from rules.builtin import PACKS_DIR
from rules.packs import PackError, StrictLoader, load_diagnosis_pack, load_filter_pack
from service.admin.review import parse_pack
from service.errors import Unprocessable

PACK_FILES = sorted(PACKS_DIR.glob("*/*.yaml"))


@pytest.mark.parametrize("path", [*PACK_FILES, *sorted(PACKS_DIR.glob("*.yaml"))],
                         ids=lambda p: p.relative_to(PACKS_DIR).as_posix())
def test_no_built_in_yaml_gives_a_key_twice(path: Path) -> None:
    """YAML keeps the last of two equal keys silently: a pattern's `caseless: true` written
    twice, or once under the wrong entry, would lose one of them."""
    yaml.load(path.read_text(encoding="utf-8"), Loader=StrictLoader)  # noqa: S506 - a SafeLoader


def test_a_key_given_twice_is_refused_by_the_strict_loader() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="'pattern' is given twice"):
        yaml.load("patterns:\n  - pattern: 'a'\n    pattern: 'b'\n", Loader=StrictLoader)  # noqa: S506


def test_the_committed_json_schema_is_the_models_own() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), "run: python -m rules.pack_schema"


@pytest.mark.parametrize("path", PACK_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_built_in_pack_names_the_schema_and_passes_it_as_an_editor_checks_it(path: Path) -> None:
    assert path.read_text(encoding="utf-8").splitlines()[0] == "# yaml-language-server: $schema=../schema.json"
    validator = jsonschema_rs.validator_for(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text(encoding="utf-8")))]
    assert not errors, errors[:5]


def test_the_json_schema_refuses_what_the_loader_refuses() -> None:
    validator = jsonschema_rs.validator_for(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    good = {"id": "x.oom", "reason": "out_of_memory", "patterns": ["CUDA out of memory"]}
    assert validator.is_valid({"rules": [good]})
    assert not validator.is_valid({"rules": [{**good, "reason": "gremlins"}]})
    assert not validator.is_valid({"rules": [{**good, "counter_example": ["x"]}]})
    assert not validator.is_valid({"rules": [{"id": "x.f", "description": "no pattern"}]})


@pytest.mark.parametrize(("rule", "message"), [
    ({"id": "x.oom", "reason": "out_of_memory", "patterns": ["OOM"], "counter_example": ["no"]},
     "rule 1 (x.oom): counter_example: not a field of a rule"),
    ({"id": "x.oom", "reason": "gremlins", "patterns": ["OOM"]}, "rule 1 (x.oom): reason: unknown reason 'gremlins'"),
    ({"id": "x.oom", "reason": "out_of_memory", "patterns": []}, "rule 1 (x.oom): patterns:"),
    ({"id": "x.oom", "reason": "out_of_memory", "patterns": ["OOM"], "action": "stop"},
     "rule 1 (x.oom): action: Value error, `stop` is the restart budget's action"),
    ({"id": "x.oom", "reason": "out_of_memory", "patterns": ["OOM"], "tier": "severe"}, "rule 1 (x.oom): tier:"),
])
def test_a_bad_diagnosis_pack_is_an_error_naming_the_rule_and_the_key(tmp_path: Path, rule: dict, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"rules": [rule]}))
    with pytest.raises(PackError, match="^bad.yaml: " + message.replace("(", r"\(").replace(")", r"\)")):
        load_diagnosis_pack(path)
    with pytest.raises(Unprocessable) as caught:  # the admin import: the same check, the same words
        parse_pack(path.read_text())
    assert message in str(caught.value)


def test_a_rule_of_the_wrong_kind_for_its_folder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump({"rules": [{"id": "x.oom", "reason": "out_of_memory", "patterns": ["OOM"]}]}))
    with pytest.raises(PackError, match="x.oom' is a diagnosis rule, in a folder of filter rules"):
        load_filter_pack(path)


def test_a_filter_pack_gives_its_scope_to_rules_that_name_none(tmp_path: Path) -> None:
    path = tmp_path / "helix.yaml"
    path.write_text(yaml.safe_dump({"scope": "framework:helix", "rules": [
        {"id": "helix.step", "pattern": r"step \d+", "examples": ["step 3"]},
        {"id": "helix.any", "pattern": "ok", "scope": "global", "event": "completed"}]}))
    step, anywhere = load_filter_pack(path)
    assert (step.scope, step.examples, anywhere.scope, anywhere.event) == ("framework:helix", ("step 3",), "global", "completed")
