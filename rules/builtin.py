"""The built-in rules as a rulebook reads them: kept as JSON in the cache directory
(rules.disk_cache) under a hash of the packs and of the code that reads them, parsed from
the YAML packs by `rules.packs` only when either changed.

A short command's start neither parses YAML nor imports the pack schema (PyYAML and the
pydantic models cost about 50 ms of a 10-line `diagnose`), so `rules.packs` is imported
only on a cache miss.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rules.disk_cache import derived_json
from rules.model import DiagnosisRule, FilterRule, Tier
from rules.taxonomy import Action, Origin

PACKS_DIR = Path(__file__).parent / "packs"

_CODE = tuple(Path(__file__).with_name(name) for name in ("builtin.py", "packs.py", "pack_schema.py", "model.py",
                                                            "taxonomy.py"))
"""What turns a pack into rules: part of the cache key beside the packs' own bytes."""


def builtin_filter_rules(packs_dir: Path = PACKS_DIR) -> list[FilterRule]:
    files = sorted((packs_dir / "filters").glob("*.yaml"))

    def parse() -> list[dict]:
        from rules.packs import load_filter_pack

        return [asdict(rule) for path in files for rule in load_filter_pack(path)]

    rows = derived_json("filter-rules", [*files, *_CODE], parse)
    return [FilterRule(**{**row, "examples": tuple(row["examples"])}) for row in rows]


def builtin_diagnosis_rules(packs_dir: Path = PACKS_DIR) -> list[DiagnosisRule]:
    files = sorted((packs_dir / "diagnosis").glob("*.yaml"))

    def parse() -> list[dict]:
        from rules.packs import load_diagnosis_pack

        return [asdict(rule) for path in files for rule in load_diagnosis_pack(path)]

    rows = derived_json("diagnosis-rules", [*files, *_CODE], parse)
    return [DiagnosisRule(**{**row, "tier": Tier(row["tier"]), "origin": Origin(row["origin"]),
                             "action": Action(row["action"]), "patterns": tuple(row["patterns"]),
                             "examples": tuple(row["examples"]), "counter_examples": tuple(row["counter_examples"])})
            for row in rows]
