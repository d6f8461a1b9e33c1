"""The Failure Agent as a user meets it: the CLI stays fast when the rules resolve a log (no
model is loaded), and over HTTP a suggested rule waits in /admin/rules?status=pending with
its evidence, is approved, and then diagnoses the same failure by itself; an admin's
confirmation of a job becomes a known incident."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fixtures.logs.novel_failures import OUT_DIR
from service.settings import Settings
from tests.support.server import running_server

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "adm-5e1c9a7f3b2d6084"
ECC = ("[default0]:[rank12]:[E817 17:40:34.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 12] Process "
       "group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered\n"
       "[default0]:terminate called after throwing an instance of 'c10::DistBackendError'\n")


def run_cli(code: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(FAULTLINE_DATA_DIR=str(data_dir), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_the_cli_loads_no_model_for_a_log_the_rules_resolve(tmp_path) -> None:
    log = tmp_path / "ecc.log"
    log.write_text(ECC)
    code = ("import io, json, sys\nfrom service.cli import main\nout = io.StringIO()\n"
            f"assert main(['diagnose', {str(log)!r}, '--json'], out) == 0\n"
            "d = json.loads(out.getvalue())\n"
            # and nothing only learning needs: Drain (mining) and `regex` (a candidate's checks);
            # nor Alembic: a new data directory's schema is made from the models, not migrated
            "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'llama_index.core', 'faiss', 'drain3', 'regex',"
            " 'alembic')"
            " if m in sys.modules)\n"
            "print(json.dumps({'source': d['root_cause']['source'], 'heavy': heavy}))\n")
    done = run_cli(code, tmp_path / "data")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '{"source": "rule:gpu.ecc-uncorrectable", "heavy": []}'
    assert "loading the Failure Agent" not in done.stderr


def test_the_cli_diagnoses_a_novel_failure_with_the_agent(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(FAULTLINE_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "service.cli", "diagnose", str(OUT_DIR / "bash_permission-0.log")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "root cause: permission_error (script, origin user" in done.stdout and ", retrieval)" in done.stdout
    assert "launch_pretrain.sh" in done.stdout.split("mitigation: ", 1)[1]
    assert "Loading weights" not in done.stderr  # no progress bars from the model load
    # but one line says why it takes seconds
    assert "faultline: no rule explains this failure for sure: loading the Failure Agent" in done.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm):
    settings = Settings(data_dir=tmp_path_factory.mktemp("fa-data"), admin_token=TOKEN)
    with running_server(settings, embedder=minilm) as url:
        yield url


def admin(server: str, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{server}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120, **kwargs)


def post_log(server: str, path: Path) -> dict:
    r = httpx.post(f"{server}/diagnose", content=path.read_bytes(), timeout=300,
                   headers={"Content-Type": "text/plain"})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_suggestion_is_reviewed_approved_and_then_diagnoses_by_rule(server) -> None:
    d = post_log(server, OUT_DIR / "tokenizer_file_missing-0.log")
    assert d["root_cause"]["reason"] == "file_not_found_error" and d["root_cause"]["source"] == "retrieval"
    (suggested,) = d["suggested_rules"]
    listing = admin(server, "GET", "/admin/rules", params={"status": "pending", "kind": "diagnosis"}).json()
    row = next(r for r in listing["data"] if r["id"] == suggested["id"])
    assert row["source"] == "failure_agent" and row["reason"] == "file_not_found_error" and row["origin"] == "user"
    assert row["evidence"] == [d["root_cause"]["line"]]
    assert row["validation"]["claims"] == "ok" and row["validation"]["history"].startswith("ok")
    assert row["provenance"]["decision"]["source"] == "retrieval"
    assert admin(server, "POST", f"/admin/rules/{suggested['id']}/approve", json={"note": "right"}).status_code == 200
    again = post_log(server, OUT_DIR / "tokenizer_file_missing-1.log")  # the same failure in another job
    assert again["root_cause"]["source"] == f"rule:{suggested['id']}"
    assert again["root_cause"]["reason"] == "file_not_found_error" and again["suggested_rules"] == []
    metrics = httpx.get(f"{server}/metrics", timeout=30).text
    assert 'faultline_agent_calls_total{agent="failure_agent",backend="embedded"} 1.0' in metrics
    assert 'faultline_rules_accepted_total{agent="failure_agent",kind="diagnosis"} 1.0' in metrics


def test_an_admin_confirms_a_job_and_it_becomes_an_incident(server) -> None:
    d = post_log(server, OUT_DIR / "pydantic_config-0.log")
    r = httpx.post(f"{server}/admin/jobs/{d['job_id']}/confirm", json={}, timeout=30)
    assert r.status_code == 401
    r = admin(server, "POST", f"/admin/jobs/{d['job_id']}/confirm",
              json={"reason": "value_error", "note": "the config value was 0"})
    assert r.status_code == 200, r.text
    incident = r.json()["incident"]
    assert incident["reason"] == "value_error" and incident["confirmed_by"] == "admin"
    assert incident["line"] == d["root_cause"]["line"]
    audit = admin(server, "GET", "/admin/audit", params={"action": "job.confirm"}).json()["data"]
    assert audit[0]["target"] == d["job_id"] and audit[0]["details"]["reason"] == "value_error"
    bad = admin(server, "POST", f"/admin/jobs/{d['job_id']}/confirm", json={"reason": "cosmic_rays"})
    assert bad.status_code == 422 and "unknown reason" in bad.json()["error"]
    assert admin(server, "POST", "/admin/jobs/nope/confirm", json={}).status_code == 404
