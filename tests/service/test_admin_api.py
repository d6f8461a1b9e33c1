"""The admin API against a real uvicorn server on loopback and a real SQLite database:
auth (401/403), listing with filters and paging, details, approve, reject, edit
(re-validated), dry-run, audit, rule packs, and the service refusing unsafe tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from fixtures.logs.unknown_formats import helix_log
from service.app import create_app
from service.errors import ConfigError
from service.settings import Settings
from tests.support.server import health_when, running_server

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "adm-3f9c1e7a5b2d8046"
BOB = "bob-0c4e8a2f6d1b9735"
FABRIC_LINE = "trn-b15: [helix 23:59:01.000 trn-b15/r03] FATAL fabric: port 3 link down (flap count 12)"
FABRIC_RULE = {
    "id": "site.fabric-link-down", "kind": "diagnosis", "reason": "network_error", "tier": "network",
    "patterns": [r"fabric: port \d+ link down"], "scope": "global",
    "description": "our fabric manager reports a link down on a port",
    "mitigation": "Cordon {node}: its fabric port went down.",
    "examples": [FABRIC_LINE], "counter_examples": ["fabric: port 3 link up"],
}


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def admin(server: str, method: str, path: str, *, token: str | None = TOKEN, **kwargs) -> httpx.Response:
    headers = {**kwargs.pop("headers", {}), **(auth(token) if token else {})}
    return httpx.request(method, f"{server}{path}", headers=headers, timeout=120, **kwargs)


def settings_for(data_dir: Path, **overrides) -> Settings:
    return Settings(data_dir=data_dir, admin_token=TOKEN, admin_tokens=f"bob:{BOB}", **overrides)


def seed_log(seed: int = 33, *, fabric: bool = False) -> str:
    log = helix_log(steps=3000, nodes=1, ranks_per_node=8, seed=seed, failure=None if fabric else "keyerror")
    return log.text() + (FABRIC_LINE + "\n" if fabric else "")


def diagnose(server: str, text: str, **params) -> dict:
    r = httpx.post(f"{server}/diagnose", content=text, params=params, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    """A server whose anonymous job left pending global rules (the Log Agent's suggestions)."""
    with running_server(settings_for(tmp_path_factory.mktemp("admin-data"))) as url:
        diagnose(url, seed_log(33))
        yield url


@pytest.fixture(scope="module")
def pending(server) -> list[str]:
    """Ids of pending rules; each test that changes one takes its own."""
    listing = admin(server, "GET", "/admin/rules", params={"status": "pending", "limit": 500}).json()
    ids = [r["id"] for r in listing["data"]]
    assert len(ids) >= 5, listing
    return ids


# -- auth --------------------------------------------------------------------------------------
ENDPOINTS = [
    ("GET", "/admin/rules"), ("GET", "/admin/rules/some-id"), ("GET", "/admin/rules/some-id/versions"),
    ("POST", "/admin/rules/some-id/approve"), ("POST", "/admin/rules/some-id/reject"),
    ("PATCH", "/admin/rules/some-id"), ("POST", "/admin/rules/some-id/dry-run"),
    ("GET", "/admin/rules/export"), ("POST", "/admin/rules/import"), ("GET", "/admin/audit"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_needs_the_admin_token(server: str, method: str, path: str) -> None:
    missing = admin(server, method, path, token=None)
    assert missing.status_code == 401, missing.text
    assert missing.json()["status"] == 401 and "Bearer" in missing.json()["error"]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    basic = admin(server, method, path, token=None, headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    assert basic.status_code == 401
    wrong = admin(server, method, path, token=TOKEN + "x")
    assert wrong.status_code == 403 and wrong.json() == {"error": "the admin token is not valid", "status": 403}


@pytest.mark.parametrize("token", ["", "changeme", "CHANGEME", "secret", "short-token", "x" * 32,
                                   "please-changeme-now-0123"])
def test_the_app_refuses_to_start_without_a_real_token(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError, match="FAULTLINE_ADMIN_TOKEN"):
        create_app(Settings(data_dir=tmp_path, admin_token=token))


def test_admin_can_be_disabled_and_token_labels_must_be_sound(tmp_path: Path) -> None:
    create_app(Settings(data_dir=tmp_path, admin_enabled=False))  # no token needed
    with pytest.raises(ConfigError, match="unique"):
        create_app(Settings(data_dir=tmp_path, admin_token=TOKEN, admin_tokens=f"admin:{BOB}"))
    with pytest.raises(ConfigError, match="bob"):
        create_app(Settings(data_dir=tmp_path, admin_token=TOKEN, admin_tokens="bob:changeme"))


def test_faultline_serve_refuses_a_placeholder_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(FAULTLINE_DATA_DIR=str(tmp_path), FAULTLINE_ADMIN_TOKEN="changeme", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--port", "1"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "FAULTLINE_ADMIN_TOKEN" in done.stderr


# -- list and detail -------------------------------------------------------------------------------
def test_pending_rules_come_with_evidence_proposer_votes_and_validation(server: str, pending) -> None:
    r = admin(server, "GET", "/admin/rules", params={"status": "pending"})
    assert r.status_code == 200
    body = r.json()
    assert body["total"] >= 1 and body["limit"] == 50 and body["offset"] == 0
    rule = body["data"][0]
    assert rule["kind"] == "filter" and rule["scope"] == "global" and rule["source"] == "log_agent:embedded"
    assert rule["proposer"]["backend"] == "embedded" and rule["proposer"]["model"] == "drain3"
    assert rule["votes"]["votes"] >= rule["votes"]["quorum"] and rule["votes"]["k"] == 5
    assert rule["evidence"] and all("[helix" in line for line in rule["evidence"])
    assert set(rule["validation"].values()) == {"ok"} and "no_error_lines" in rule["validation"]
    assert isinstance(rule["hits"], int)


def test_filters_and_paging(server: str, pending) -> None:
    everything = admin(server, "GET", "/admin/rules", params={"limit": 500}).json()
    total = everything["total"]
    first = admin(server, "GET", "/admin/rules", params={"limit": 2}).json()
    second = admin(server, "GET", "/admin/rules", params={"limit": 2, "offset": 2}).json()
    assert first["total"] == second["total"] == total
    assert len(first["data"]) == 2 and {r["id"] for r in first["data"]}.isdisjoint(r["id"] for r in second["data"])
    assert admin(server, "GET", "/admin/rules", params={"kind": "diagnosis", "source": "log_agent"}).json()["total"] == 0
    by_source = admin(server, "GET", "/admin/rules", params={"source": "log_agent", "limit": 500}).json()
    assert by_source["total"] >= len(pending)
    assert admin(server, "GET", "/admin/rules", params={"scope": "family:nope"}).json() == {
        "data": [], "total": 0, "limit": 50, "offset": 0}
    for params in ({"status": "maybe"}, {"kind": "regex"}, {"limit": 0}, {"limit": 501}, {"offset": -1}):
        bad = admin(server, "GET", "/admin/rules", params=params)
        assert bad.status_code == 422 and bad.json()["status"] == 422, params


def test_rule_detail_has_versions_and_audit_and_unknown_is_404(server: str, pending) -> None:
    rule_id = pending[-1]
    detail = admin(server, "GET", f"/admin/rules/{rule_id}").json()
    assert detail["id"] == rule_id and detail["evidence"] and detail["validation"]
    assert [v["change"] for v in detail["versions"]] == ["created"]
    assert detail["versions"][0]["changed_by"] == "log_agent" and detail["versions"][0]["data"]["pattern"]
    assert [a["action"] for a in detail["audit"]] == ["rule.create"]
    versions = admin(server, "GET", f"/admin/rules/{rule_id}/versions").json()["data"]
    assert versions == detail["versions"]
    for method, path in [("GET", "/admin/rules/nope"), ("GET", "/admin/rules/nope/versions"),
                         ("POST", "/admin/rules/nope/approve"), ("PATCH", "/admin/rules/nope"),
                         ("POST", "/admin/rules/nope/dry-run")]:
        kwargs = {"json": {"description": "x"}} if method == "PATCH" else {}
        r = admin(server, method, path, **kwargs)
        assert r.status_code == 404 and r.json() == {"error": "no rule 'nope'", "status": 404}, (method, path)
    r = admin(server, "POST", "/admin/rules/nope/reject", json={"reason": "noise"})
    assert r.status_code == 404
    long = admin(server, "GET", "/admin/rules/" + "x" * 5000)
    assert long.status_code == 404 and len(long.json()["error"]) < 120  # the id is not echoed whole


# -- approve and reject --------------------------------------------------------------------------------
def test_approve_makes_the_rule_apply_to_the_next_diagnosis(server: str, pending) -> None:
    rule_id = pending[0]
    before = diagnose(server, seed_log(33))
    assert rule_id not in {f["rule"] for f in before["filtered"]}
    r = admin(server, "POST", f"/admin/rules/{rule_id}/approve", json={"note": "looks routine"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "active" and r.json()["version"] == 2 and r.json()["review_note"] == "looks routine"
    after = diagnose(server, seed_log(33))
    dropped = {f["rule"]: f["count"] for f in after["filtered"]}
    assert dropped.get(rule_id, 0) > 0
    assert after["compression"]["lines_kept"] < before["compression"]["lines_kept"]
    assert after["root_cause"]["line"] == before["root_cause"]["line"]  # an error line is never dropped
    detail = admin(server, "GET", f"/admin/rules/{rule_id}").json()
    assert detail["hits"] >= dropped[rule_id]
    assert [v["change"] for v in detail["versions"]] == ["created", "active"]
    assert detail["audit"][0]["action"] == "rule.active" and detail["audit"][0]["actor"] == "admin"
    again = admin(server, "POST", f"/admin/rules/{rule_id}/approve")
    assert again.status_code == 409 and "already active" in again.json()["error"]


def test_reject_needs_a_reason_and_names_who_did_it(server: str, pending) -> None:
    rule_id = pending[1]
    for kwargs in ({}, {"json": {}}, {"json": {"reason": "   "}}, {"json": {"reason": "x", "extra": 1}}):
        r = admin(server, "POST", f"/admin/rules/{rule_id}/reject", **kwargs)
        assert r.status_code == 422 and r.json()["status"] == 422, kwargs
    assert admin(server, "GET", f"/admin/rules/{rule_id}").json()["status"] == "pending"
    r = admin(server, "POST", f"/admin/rules/{rule_id}/reject", token=BOB, json={"reason": "hides rank chatter"})
    assert r.status_code == 200 and r.json()["status"] == "rejected" and r.json()["review_note"] == "hides rank chatter"
    again = admin(server, "POST", f"/admin/rules/{rule_id}/reject", json={"reason": "twice"})
    assert again.status_code == 409
    audit = admin(server, "GET", "/admin/audit", params={"target": rule_id}).json()["data"]
    assert audit[0]["actor"] == "bob" and audit[0]["action"] == "rule.rejected"
    assert audit[0]["details"] == {"note": "hides rank chatter"}
    # a rejected rule may still be approved after all
    assert admin(server, "POST", f"/admin/rules/{rule_id}/approve").json()["status"] == "active"


# -- edit ---------------------------------------------------------------------------------------------
def test_edit_is_validated_again_and_makes_a_version(server: str, pending) -> None:
    rule_id = pending[2]
    rule = admin(server, "GET", f"/admin/rules/{rule_id}").json()
    wrapped = f"(?:{rule['pattern']})"
    r = admin(server, "PATCH", f"/admin/rules/{rule_id}",
              json={"pattern": wrapped, "description": "helix <b>chatter</b>", "scope": "framework:helix"})
    assert r.status_code == 200, r.text
    edited = r.json()
    assert edited["pattern"] == wrapped and edited["scope"] == "framework:helix" and edited["version"] == 2
    assert edited["description"] == "helix <b>chatter</b>" and edited["status"] == "pending"
    assert set(edited["validation"].values()) == {"ok"}
    detail = admin(server, "GET", f"/admin/rules/{rule_id}").json()
    assert [v["change"] for v in detail["versions"]] == ["created", "edited"]
    assert detail["versions"][0]["data"]["pattern"] == rule["pattern"]
    assert detail["audit"][0]["action"] == "rule.edit"
    assert detail["audit"][0]["details"]["fields"] == ["description", "pattern", "provenance", "scope"]


@pytest.mark.parametrize(("change", "message"), [
    ({"pattern": ".*"}, "no_error_lines"),
    ({"pattern": "[helix"}, "syntax"),
    ({"pattern": r"(a+)+\[helix.*"}, "bounded_time"),
    ({"pattern": "trn-b15: .*", "examples": ["nothing like it"]}, "claims"),
    ({"pattern": "[^x]*helix[^x]*"}, "line_bounded"),
    ({"scope": "everywhere"}, "scope must be"),
    ({"reason": "key_error"}, "cannot edit reason of a filter rule"),
    ({}, "nothing to change"),
    ({"pattern": 3}, "pattern"),
    ({"colour": "red"}, "colour"),
])
def test_invalid_edits_are_422_with_the_validators_reason(server: str, pending, change: dict, message: str) -> None:
    rule_id = pending[3]
    r = admin(server, "PATCH", f"/admin/rules/{rule_id}", json=change)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]
    if "checks" in r.json():
        assert any(v.startswith("failed") for v in r.json()["checks"].values())
    assert admin(server, "GET", f"/admin/rules/{rule_id}").json()["version"] == 1  # nothing changed


# -- dry-run ------------------------------------------------------------------------------------------
def test_dry_run_of_a_filter_rule_shows_the_lines_it_would_drop(server: str, pending) -> None:
    rule_id = pending[4]
    rule = admin(server, "GET", f"/admin/rules/{rule_id}").json()
    r = admin(server, "POST", f"/admin/rules/{rule_id}/dry-run")
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["jobs_scanned"] >= 1 and report["matched_jobs"] >= 1 and report["changed_jobs"] == 0
    job = report["jobs"][0]
    assert job["matched_lines"] > 0 and job["lines_kept"]["after"] == job["lines_kept"]["before"] - job["matched_lines"]
    assert set(job["sample"]) <= set(rule["evidence"]) | set(job["sample"]) and job["sample"]
    assert job["before"]["reason"] == job["after"]["reason"] == "key_error"
    assert job["before"]["line_number"] == job["after"]["line_number"] > 500  # lines of the original log
    assert admin(server, "GET", f"/admin/rules/{rule_id}").json()["status"] == "pending"  # nothing saved
    # a changed pattern can be tried without saving it; one that matches nothing matches no job
    narrowed = admin(server, "POST", f"/admin/rules/{rule_id}/dry-run", json={"pattern": "zzz-never-seen [0-9]+"})
    assert narrowed.status_code == 200 and narrowed.json()["matched_jobs"] == 0
    assert narrowed.json()["rule"]["changed"] == ["pattern"]
    bad = admin(server, "POST", f"/admin/rules/{rule_id}/dry-run", json={"pattern": "(unclosed"})
    assert bad.status_code == 422 and "compile" in bad.json()["error"]
    assert admin(server, "POST", f"/admin/rules/{rule_id}/dry-run", json={"jobs": 0}).status_code == 422
    audit = admin(server, "GET", "/admin/audit", params={"target": rule_id, "action": "rule.dry_run"}).json()
    assert audit["total"] == 2  # the two that ran


def test_dry_run_of_a_diagnosis_rule_shows_how_diagnoses_change(server: str) -> None:
    diagnose(server, seed_log(34, fabric=True))
    pack = yaml.safe_dump({"rules": [FABRIC_RULE]})
    r = admin(server, "POST", "/admin/rules/import", content=pack, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 200 and r.json()["created"] == [FABRIC_RULE["id"]], r.text
    report = admin(server, "POST", f"/admin/rules/{FABRIC_RULE['id']}/dry-run").json()
    assert report["matched_jobs"] == 1 and report["changed_jobs"] == 1
    job = report["jobs"][0]
    # the seeded log ends with a FATAL line no rule knows: failed, and the rules alone name no reason
    assert job["sample"] == [FABRIC_LINE] and job["stored"]["status"] == "failed"
    assert job["before"]["status"] == "failed" and job["before"]["reason"] == "unknown"
    assert job["after"] == {"status": "failed", "reason": "network_error", "origin": "infrastructure",
                            "source": f"rule:{FABRIC_RULE['id']}", "line": FABRIC_LINE,
                            "line_number": len(seed_log(34, fabric=True).splitlines()), "action": job["after"]["action"]}


# -- audit ---------------------------------------------------------------------------------------------
def test_audit_log_filters_and_pages(server: str, pending) -> None:
    admin(server, "POST", f"/admin/rules/{pending[5]}/reject", token=BOB, json={"reason": "duplicate"})
    everything = admin(server, "GET", "/admin/audit", params={"limit": 500}).json()
    assert everything["total"] == len(everything["data"]) > 5
    assert {e["actor"] for e in everything["data"]} >= {"log_agent", "admin", "bob"}
    bobs = admin(server, "GET", "/admin/audit", params={"actor": "bob"}).json()["data"]
    assert bobs and all(e["actor"] == "bob" for e in bobs)
    rule_actions = admin(server, "GET", "/admin/audit", params={"action": "rule.", "limit": 3}).json()
    assert len(rule_actions["data"]) == 3 and all(e["action"].startswith("rule.") for e in rule_actions["data"])
    ids = [e["id"] for e in everything["data"]]
    assert ids == sorted(ids, reverse=True) and all(e["at"] for e in everything["data"])
    assert admin(server, "GET", "/admin/audit", params={"limit": 0}).status_code == 422


# -- rule packs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("body", "content_type", "status", "message"), [
    ("rules: [", "application/yaml", 422, "not valid YAML"),
    ("- a\n- b\n", "application/yaml", 422, "'rules' list"),
    (yaml.safe_dump({"rules": [{"id": "a.b", "pattern": ".*", "examples": ["x"]}]}), "application/yaml", 422,
     "a.b"),
    (yaml.safe_dump({"rules": [{"id": "a.b", "pattern": "alpha [0-9]+ beta"}]}), "application/yaml", 422,
     "no example line"),
    (yaml.safe_dump({"rules": [{"id": "a.b", "pattern": "alpha [0-9]+", "examples": ["alpha 1"]} for _ in "12"]}),
     "text/plain", 422, "duplicate id"),  # two dicts, not one twice: PyYAML would write an alias
    (yaml.safe_dump({"rules": [{"id": "global.blank", "pattern": "alpha [0-9]+", "examples": ["alpha 1"]}]}),
     "application/yaml", 422, "built-in"),
    (yaml.safe_dump({"rules": [{"id": "x y", "pattern": "alpha"}]}), "application/yaml", 422, "id"),
    (yaml.safe_dump({"rules": [{"id": "d.x", "reason": "flux_capacitor", "patterns": ["boom"]}]}),
     "application/yaml", 422, "unknown reason"),
    (yaml.safe_dump({"rules": [{**FABRIC_RULE, "id": "d.y", "examples": ["nothing"]}]}), "application/yaml", 422,
     "claims"),
    ("rules: []", "application/json", 415, "application/yaml"),
    # a "billion laughs": 300 bytes that expand to 43 million items once walked
    ("a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip(
        "abcdefg", "bcdefgh", strict=True)) + "rules:\n- id: *h\n  pattern: x\n", "application/yaml", 422,
     "may not use YAML aliases"),
    (yaml.safe_dump({"rules": [{"id": "export", "pattern": "alpha [0-9]+", "examples": ["alpha 1"]}]}),
     "application/yaml", 422, "reserved"),
])
def test_bad_packs_are_refused_and_nothing_is_imported(server: str, body: str, content_type: str, status: int,
                                                        message: str) -> None:
    before = admin(server, "GET", "/admin/rules", params={"limit": 1}).json()["total"]
    r = admin(server, "POST", "/admin/rules/import", content=body, headers={"Content-Type": content_type})
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert admin(server, "GET", "/admin/rules", params={"limit": 1}).json()["total"] == before


def test_export_then_import_into_a_fresh_database_gives_the_same_rules_and_diagnoses(tmp_path: Path) -> None:
    fabric_log = seed_log(35, fabric=True)
    with running_server(settings_for(tmp_path / "a")) as a:
        diagnose(a, seed_log(33))
        pending = admin(a, "GET", "/admin/rules", params={"status": "pending", "limit": 500}).json()["data"]
        for rule in pending[:4]:
            assert admin(a, "POST", f"/admin/rules/{rule['id']}/approve").status_code == 200
        imported = admin(a, "POST", "/admin/rules/import", params={"status": "active"},
                         content=yaml.safe_dump({"rules": [FABRIC_RULE]}))
        assert imported.status_code == 200 and imported.json()["created"] == [FABRIC_RULE["id"]]
        exported = admin(a, "GET", "/admin/rules/export")
        assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/yaml")
        assert exported.headers["x-rule-count"] == "5"
        rules_a = admin(a, "GET", "/admin/rules", params={"status": "active", "limit": 500}).json()["data"]
        on_a = [diagnose(a, fabric_log), diagnose(a, seed_log(36))]
    pack = yaml.safe_load(exported.text)
    assert pack["format"] == "faultline-rules/1" and len(pack["rules"]) == 5
    assert all(item["examples"] for item in pack["rules"])

    with running_server(settings_for(tmp_path / "c")) as c:
        unaware = diagnose(c, fabric_log)  # a database that never saw the pack

    with running_server(settings_for(tmp_path / "b")) as b:
        r = admin(b, "POST", "/admin/rules/import", params={"status": "active"}, content=exported.text)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["created"]) == sorted(rule["id"] for rule in rules_a)
        rules_b = admin(b, "GET", "/admin/rules", params={"status": "active", "limit": 500}).json()["data"]
        on_b = [diagnose(b, fabric_log), diagnose(b, seed_log(36))]

        # importing the same pack again changes nothing; changed content follows on_conflict
        again = admin(b, "POST", "/admin/rules/import", content=exported.text).json()
        assert again["created"] == [] and len(again["unchanged"]) == 5
        changed = yaml.safe_load(exported.text)
        changed["rules"][0]["description"] = "edited on the other cluster"
        changed_text = yaml.safe_dump(changed)
        first_id = changed["rules"][0]["id"]
        assert admin(b, "POST", "/admin/rules/import", content=changed_text).json()["skipped"] == [first_id]
        conflict = admin(b, "POST", "/admin/rules/import", params={"on_conflict": "fail"}, content=changed_text)
        assert conflict.status_code == 409 and conflict.json()["conflicts"] == [first_id]
        replaced = admin(b, "POST", "/admin/rules/import", params={"on_conflict": "replace"}, content=changed_text)
        assert replaced.json()["replaced"] == [first_id]
        detail = admin(b, "GET", f"/admin/rules/{first_id}").json()
        assert detail["description"] == "edited on the other cluster" and detail["version"] == 2
        assert detail["status"] == "active"

    def content(rule: dict) -> tuple:
        return (rule["id"], rule["kind"], rule["scope"], rule["pattern"], rule["description"],
                tuple(rule.get("patterns") or ()), rule.get("reason"), rule.get("tier"))

    assert sorted(map(content, rules_a)) == sorted(map(content, rules_b))
    assert {r["source"] for r in rules_b} == {"import"}
    # without the pack the FATAL line still fails the job (never silent), but no rule names it
    assert unaware["status"] == "failed" and not unaware["root_cause"]["source"].startswith("rule:")
    for x, y in zip(on_a, on_b, strict=True):
        assert x["root_cause"] == y["root_cause"] and x["status"] == y["status"]
        assert x["compression"] == y["compression"]
        assert sorted((f["rule"], f["count"]) for f in x["filtered"]) == sorted((f["rule"], f["count"]) for f in y["filtered"])
    assert on_b[0]["root_cause"]["reason"] == "network_error" and on_b[0]["root_cause"]["line"] == FABRIC_LINE


def test_export_filters_by_kind_and_status(server: str) -> None:
    admin(server, "POST", "/admin/rules/import", content=yaml.safe_dump({"rules": [FABRIC_RULE]}))
    diag = yaml.safe_load(admin(server, "GET", "/admin/rules/export", params={"kind": "diagnosis", "status": "all"}).text)
    # the imported rule, and what the Failure Agent suggested for the logs no rule knew
    (fabric,) = [r for r in diag["rules"] if r["id"] == FABRIC_RULE["id"]]
    assert all(r["kind"] == "diagnosis" for r in diag["rules"])
    assert {r["id"] for r in diag["rules"]} - {FABRIC_RULE["id"]} <= {r["id"] for r in diag["rules"] if r["id"].startswith("fa.")}
    assert fabric["patterns"] == FABRIC_RULE["patterns"]
    assert fabric["counter_examples"] == FABRIC_RULE["counter_examples"]
    pending = yaml.safe_load(admin(server, "GET", "/admin/rules/export", params={"status": "pending"}).text)
    assert pending["rules"] and {r["status"] for r in pending["rules"]} == {"pending"}
    assert admin(server, "GET", "/admin/rules/export", params={"status": "maybe"}).status_code == 422


def test_healthz_reports_the_rules_a_replica_applies_even_before_its_next_diagnosis(tmp_path: Path) -> None:
    # two services on one database; b serves no diagnosis between the approval on a and its
    # /healthz (a worker that had been idle reported the rule set it last saw)
    with running_server(settings_for(tmp_path / "shared")) as a, running_server(settings_for(tmp_path / "shared")) as b:
        before = httpx.get(f"{b}/healthz", timeout=10).json()["rules_version"]
        r = admin(a, "POST", "/admin/rules/import", params={"status": "active"},
                  content=yaml.safe_dump({"rules": [FABRIC_RULE]}))
        assert r.status_code == 200 and r.json()["created"] == [FABRIC_RULE["id"]], r.text
        assert health_when(b, lambda r: r.json()["rules_version"] > before, timeout_s=10).json()["rules_version"] > before
