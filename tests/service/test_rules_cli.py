"""`faultline compress --json` and `faultline rules list` as a user runs them: subprocesses
with their own data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.logs.unknown_formats import helix_log, maxtext_log
from tests.support.databases import cli_env

ROOT = Path(__file__).resolve().parents[2]


def faultline(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(cli_env(data_dir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def learned(tmp_path_factory) -> dict:
    """One compress run of an unknown-format log under a job name, then the rule store."""
    tmp = tmp_path_factory.mktemp("cli")
    log = maxtext_log(steps=1500, workers=4, seed=31, failure="oom")
    path = tmp / "maxtext.log"
    path.write_text(log.text())
    data_dir = tmp / "data"
    done = faultline("compress", str(path), "--json", "--job-name", log.name, data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    listed = faultline("rules", "list", "--json", data_dir=data_dir)
    assert listed.returncode == 0, listed.stderr
    return {"log": log, "path": path, "data_dir": data_dir, "compress": json.loads(done.stdout),
            "rules": json.loads(listed.stdout)}


def test_compress_json_reports_the_rules_learned(learned) -> None:
    out, log = learned["compress"], learned["log"]
    assert out["lines_in"] == len(log.lines)
    assert out["rules_learned"] == len(out["learned"]) > 0
    assert out["lines_kept"] < out["lines_in"] / 3
    assert all(r["source"] == "log_agent:embedded" and r["scope"] == "family:maxtext-llama2-7b"
               for r in out["learned"])
    error_lines = [line for line, kind in zip(log.lines, log.kinds, strict=True) if kind == "error"]
    assert set(error_lines) <= set(out["kept"])


def test_rules_list_json_shows_them_with_provenance(learned) -> None:
    listing = learned["rules"]
    learned_ids = {r["id"] for r in learned["compress"]["learned"]}
    assert listing["total"] >= len(learned_ids)
    by_id = {r["id"]: r for r in listing["rules"]}
    assert learned_ids <= set(by_id)
    rule = by_id[next(iter(learned_ids))]
    assert rule["kind"] == "filter" and rule["status"] == "active"
    prov = rule["provenance"]
    assert prov["backend"] == "embedded" and prov["model"] == "drain3" and prov["votes"] >= 3
    assert prov["evidence"] and prov["validation"]["no_error_lines"] == "ok"
    assert prov["job"]["name"] == learned["log"].name
    hits = sum(r["hits"] for r in listing["rules"])
    assert hits > 0  # the job's filtered lines were counted for the rules that dropped them


def test_rules_list_filters_and_prints_for_people(learned) -> None:
    data_dir = learned["data_dir"]
    text = faultline("rules", "list", data_dir=data_dir)
    assert text.returncode == 0
    assert "learned by embedded (drain3), votes" in text.stdout and "pattern: " in text.stdout
    pending = faultline("rules", "list", "--status", "pending", "--json", data_dir=data_dir)
    assert json.loads(pending.stdout) == {"total": 0, "rules": []}
    diag = faultline("rules", "list", "--kind", "diagnosis", data_dir=data_dir)
    assert diag.stdout == "no rules\n"


def test_resubmitted_job_starts_with_its_family_rules(learned, tmp_path) -> None:
    again = maxtext_log(steps=500, workers=4, seed=32, failure="oom")
    path = tmp_path / "again.log"
    path.write_text(again.text())
    done = faultline("compress", str(path), "--json", "--job-name", again.name, data_dir=learned["data_dir"])
    out = json.loads(done.stdout)
    assert out["lines_kept"] < out["lines_in"] / 10
    routine_kept = set(out["kept"]) - {line for line, k in zip(again.lines, again.kinds, strict=True) if k == "error"}
    assert len(routine_kept) < len(again.lines) / 20


def test_anonymous_compress_stores_rules_as_pending_global(tmp_path) -> None:
    log = helix_log(steps=6000, nodes=1, ranks_per_node=8, seed=33, failure=None)
    path = tmp_path / "helix.log"
    path.write_text(log.text())
    data_dir = tmp_path / "data"
    out = json.loads(faultline("compress", str(path), "--json", data_dir=data_dir).stdout)
    assert out["rules_learned"] > 0
    listing = json.loads(faultline("rules", "list", "--status", "pending", "--json", data_dir=data_dir).stdout)
    assert listing["total"] == out["rules_learned"]
    assert {r["scope"] for r in listing["rules"]} == {"global"}


@pytest.mark.parametrize("args", [["rules"], ["rules", "list", "--status", "maybe"], ["rules", "frobnicate"]])
def test_bad_usage_exits_2_with_one_line(args, tmp_path) -> None:
    done = faultline(*args, data_dir=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
