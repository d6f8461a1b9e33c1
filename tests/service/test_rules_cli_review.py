"""`faultline rules approve|reject|export|import` as a user runs them: subprocesses on their
own data dirs (real SQLite files), the same store and audit log as the admin API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.logs.unknown_formats import helix_log
from service.store import jobs as store
from service.store.db import Database
from tests.support.databases import cli_env, database_url

ROOT = Path(__file__).resolve().parents[2]


def faultline(*args: str, data_dir: Path, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    environ.update(cli_env(data_dir), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          env=environ, cwd=ROOT, timeout=300, input=stdin)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr
    return done


def audit(data_dir: Path) -> list[dict]:
    db = Database(database_url(data_dir))
    try:
        with db.session() as session:
            entries, _ = store.audit_entries(session, limit=500)
            return [store.audit_to_dict(e) for e in entries]
    finally:
        db.close()


@pytest.fixture(scope="module")
def suggested(tmp_path_factory) -> dict:
    """An anonymous compress run: the Log Agent's rules wait as pending global rules."""
    tmp = tmp_path_factory.mktemp("review-cli")
    log = tmp / "helix.log"
    log.write_text(helix_log(steps=6000, nodes=1, ranks_per_node=8, seed=51, failure="keyerror").text())
    data = tmp / "a"
    ok(faultline("compress", str(log), "--json", data_dir=data))
    listing = json.loads(ok(faultline("rules", "list", "--status", "pending", "--json", data_dir=data)).stdout)
    assert listing["total"] >= 3
    return {"tmp": tmp, "log": log, "data": data, "ids": [r["id"] for r in listing["rules"]]}


def test_approve_and_reject_write_the_store_and_the_audit_log(suggested) -> None:
    data, ids = suggested["data"], suggested["ids"]
    done = ok(faultline("rules", "approve", ids[0], "--note", "routine gc line", "--actor", "alice", "--json",
                        data_dir=data))
    rule = json.loads(done.stdout)
    assert rule["status"] == "active" and rule["version"] == 2 and rule["review_note"] == "routine gc line"
    again = faultline("rules", "approve", ids[0], data_dir=data)
    assert again.returncode == 2 and again.stderr.strip() == f"faultline: error: rule {ids[0]!r} is already active"
    text = ok(faultline("rules", "reject", ids[1], "--reason", "hides heartbeats", data_dir=data)).stdout
    assert text == f"{ids[1]}: rejected (version 2): hides heartbeats\n"
    entries = audit(data)
    assert entries[0]["action"] == "rule.rejected" and entries[0]["actor"].startswith("cli:")
    assert entries[1] == {**entries[1], "action": "rule.active", "actor": "alice", "target": ids[0]}
    active = json.loads(ok(faultline("rules", "list", "--status", "active", "--json", data_dir=data)).stdout)
    assert [r["id"] for r in active["rules"]] == [ids[0]]


@pytest.mark.parametrize(("args", "message"), [
    (["rules", "reject", "some-id"], "--reason"),
    (["rules", "reject", "some-id", "--reason", "  "], "a reason is required"),
    (["rules", "approve", "no-such-rule"], "no rule 'no-such-rule'"),
    (["rules", "approve"], "ID"),
    (["rules", "import", "/no/such/pack.yaml"], "cannot read"),
    (["rules", "import", "-", "--status", "rejected"], "--status"),
    (["rules", "export", "--status", "maybe"], "--status"),
])
def test_bad_usage_exits_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = faultline(*args, data_dir=tmp_path, stdin="rules: []\n")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_export_then_import_into_a_fresh_database_gives_the_same_rules_and_diagnoses(suggested) -> None:
    data, tmp = suggested["data"], suggested["tmp"]
    ok(faultline("rules", "approve", suggested["ids"][2], data_dir=data))
    pack = tmp / "pack.yaml"
    done = ok(faultline("rules", "export", "-o", str(pack), data_dir=data))
    assert done.stdout == "" and "exported 2 rule(s)" in done.stderr
    exported = yaml.safe_load(pack.read_text())
    assert sorted(r["id"] for r in exported["rules"]) == sorted(suggested["ids"][0:3:2])
    everything = yaml.safe_load(ok(faultline("rules", "export", "--status", "all", data_dir=data)).stdout)
    assert len(everything["rules"]) == len(suggested["ids"])

    fresh = tmp / "b"
    result = json.loads(ok(faultline("rules", "import", str(pack), "--status", "active", "--json",
                                     data_dir=fresh)).stdout)
    assert sorted(result["created"]) == sorted(r["id"] for r in exported["rules"])
    on_a = json.loads(ok(faultline("rules", "list", "--status", "active", "--json", data_dir=data)).stdout)["rules"]
    on_b = json.loads(ok(faultline("rules", "list", "--status", "active", "--json", data_dir=fresh)).stdout)["rules"]
    assert sorted((r["id"], r["pattern"], r["scope"], r["kind"]) for r in on_a) == \
        sorted((r["id"], r["pattern"], r["scope"], r["kind"]) for r in on_b)

    def diagnosis(data_dir: Path) -> dict:
        done = ok(faultline("diagnose", str(suggested["log"]), "--json", data_dir=data_dir, FAULTLINE_LOG_AGENT="false"))
        return json.loads(done.stdout)

    a, b, empty = diagnosis(data), diagnosis(fresh), diagnosis(tmp / "c")
    assert a["root_cause"] == b["root_cause"] and a["compression"] == b["compression"]
    assert a["filtered"] == b["filtered"]
    assert {f["rule"] for f in a["filtered"]} >= {r["id"] for r in on_a}
    assert b["compression"]["lines_kept"] < empty["compression"]["lines_kept"]  # the imported rules work

    # stdin, pending by default, unchanged the second time
    again = ok(faultline("rules", "import", "-", data_dir=fresh, stdin=pack.read_text())).stdout
    assert again.startswith("imported as pending: 0 created, 0 activated, 0 replaced, 2 unchanged")


def test_an_invalid_pack_imports_nothing(tmp_path: Path) -> None:
    pack = tmp_path / "bad.yaml"
    pack.write_text(yaml.safe_dump({"rules": [
        {"id": "fine.rule", "pattern": r"heartbeat [0-9]+ ok", "examples": ["heartbeat 12 ok"]},
        {"id": "too.general", "pattern": ".*", "examples": ["anything"]},
    ]}))
    done = faultline("rules", "import", str(pack), data_dir=tmp_path / "d")
    assert done.returncode == 2 and "too.general" in done.stderr and "nothing was imported" in done.stderr
    listing = json.loads(ok(faultline("rules", "list", "--json", data_dir=tmp_path / "d")).stdout)
    assert listing["total"] == 0
