"""Parsed rule packs and guard patterns kept on disk (rules.disk_cache.derived_json): the
same rules as parsing the YAML, a new entry when a pack changes, a damaged entry parsed
again, and a malformed pack still an error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from rules import packs
from rules.disk_cache import derived_json
from rules.guard import ERROR_LIKE_FILE, load_guard_patterns
from rules.builtin import PACKS_DIR, builtin_diagnosis_rules, builtin_filter_rules
from rules.packs import PackError


def test_cached_packs_are_the_packs_as_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTLINE_CACHE_DIR", str(tmp_path))
    parsed_filters = [r for p in sorted((PACKS_DIR / "filters").glob("*.yaml")) for r in packs.load_filter_pack(p)]
    parsed_diagnosis = [r for p in sorted((PACKS_DIR / "diagnosis").glob("*.yaml")) for r in packs.load_diagnosis_pack(p)]
    parsed_guard = yaml.safe_load(ERROR_LIKE_FILE.read_text())["patterns"]
    for _ in range(2):  # derived and stored, then read back
        assert builtin_filter_rules() == parsed_filters
        assert builtin_diagnosis_rules() == parsed_diagnosis
        assert [(p.pattern, p.caseless) for p in load_guard_patterns()] == \
            [(p["pattern"], bool(p.get("caseless", False))) for p in parsed_guard]
    assert sorted(e.name.split("-rules-")[0] for e in tmp_path.glob("*-rules-*.json")) == ["diagnosis", "filter"]
    assert len(list(tmp_path.glob("guard-patterns-*.json"))) == 1


def test_a_changed_pack_is_parsed_again_and_a_bad_one_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTLINE_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "packs"
    shutil.copytree(PACKS_DIR, copy)
    before = builtin_filter_rules(copy)
    pack = copy / "filters" / "global.yaml"
    pack.write_text(pack.read_text() + "  - id: extra.rule\n    pattern: 'extra line \\d+'\n    examples: ['extra line 7']\n")
    after = builtin_filter_rules(copy)
    assert {r.id for r in after} == {r.id for r in before} | {"extra.rule"} and len(after) == len(before) + 1
    pack.write_text(pack.read_text() + "  - id: bad.rule\n    pattern: 'x'\n    counter_example: ['y']\n")
    with pytest.raises(PackError, match="counter_example"):
        builtin_filter_rules(copy)
    with pytest.raises(PackError, match="counter_example"):  # nothing was kept for it
        builtin_filter_rules(copy)


def test_a_damaged_entry_is_derived_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTLINE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "input.txt"
    source.write_text("a")
    calls = []

    def derive() -> list:
        calls.append(1)
        return [{"n": len(calls)}]

    assert derived_json("thing", [source], derive) == [{"n": 1}]
    assert derived_json("thing", [source], derive) == [{"n": 1}] and len(calls) == 1
    (entry,) = (tmp_path / "cache").glob("thing-*.json")
    entry.write_bytes(b'[{"n": ')  # cut short
    assert derived_json("thing", [source], derive) == [{"n": 2}]
    source.write_text("b")  # another input: another entry
    assert derived_json("thing", [source], derive) == [{"n": 3}]
    assert len(list((tmp_path / "cache").glob("thing-*.json"))) == 2
