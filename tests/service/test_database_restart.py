"""The database restarts under a running service (a private PostgreSQL server: the shared one
is never restarted): /healthz says unhealthy and uploads get 503 while it is down, the first
request after it returns succeeds (pool pre-ping), and nothing stored before is lost; and the
load benchmark in small, uploads and live sidecars together across a restart."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import httpx
import pytest

from service.settings import Settings
from tests.service.test_http import LOG, ROOT_LINE
from tests.support import databases, postgres_cluster
from tests.support.processes import ROOT
from tests.support.server import health_when, running_server

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster() -> Iterator[postgres_cluster.PostgresCluster]:
    if not databases.server_url():
        pytest.skip("PostgreSQL only: runs in the PostgreSQL run (FAULTLINE_TEST_DATABASE_URL)")
    reason = postgres_cluster.unavailable()
    if reason:
        pytest.skip(reason)
    with postgres_cluster.PostgresCluster() as server:
        yield server


def post(url: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/diagnose", params={"job_name": "gpt-13b-20250304-restart"}, content=LOG,
                      headers={"Content-Type": "text/plain", **headers}, timeout=60)


def test_a_database_restart_is_reported_and_survived(cluster, tmp_path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=cluster.create_database("faultline"),
                        admin_enabled=False, db_connect_timeout_s=2)
    with running_server(settings) as url:
        for _ in range(3):  # several pooled connections, all of which the restart will kill
            assert post(url).status_code == 200
        before = post(url).json()

        cluster.stop("fast")
        health = health_when(url, lambda r: r.status_code == 503)
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert health.json()["backend"] == "postgresql"
        refused = post(url, **{"Idempotency-Key": "while-down-1"})
        assert refused.status_code == 503, refused.text
        assert "database unavailable" in refused.json()["error"] and refused.headers["Retry-After"]

        cluster.start()
        # the first requests after the restart get working connections, not the dead ones
        retried = post(url, **{"Idempotency-Key": "while-down-1"})
        assert retried.status_code == 200, retried.text
        assert retried.json()["root_cause"]["line"] == ROOT_LINE
        assert [post(url).status_code for _ in range(3)] == [200] * 3
        stored = httpx.get(f"{url}/jobs/{before['job_id']}", timeout=10).json()
        assert stored["diagnosis"]["root_cause"] == before["root_cause"]
        found = httpx.get(f"{url}/jobs", params={"name": "gpt-13b-20250304-restart", "limit": 100}, timeout=10).json()
        assert found["count"] == 8  # 4 before, the retried one once, 3 after

        # a restart nobody noticed (no request while it was down): the pooled connections
        # are all dead, and still the very next request works
        cluster.stop("fast")
        cluster.start()
        assert post(url).status_code == 200
        assert health_when(url, lambda r: r.status_code == 200).status_code == 200


def test_uploads_and_live_sidecars_ride_out_a_database_restart(tmp_path) -> None:
    """bench/load_bench.py in small: two replicas on a private server, two upload clients and
    two live jobs each followed by a real `faultline tail`, the database stopped while they
    run. Nothing is lost or doubled, every job ends with its exit status and the diagnosis a
    quiet run gives. (The bench's figures at full size are in README.md; no timing here.)"""
    if not databases.server_url():
        pytest.skip("PostgreSQL only: runs in the PostgreSQL run (FAULTLINE_TEST_DATABASE_URL)")
    reason = postgres_cluster.unavailable()
    if reason:
        pytest.skip(reason)
    from bench import load_bench

    out = tmp_path / "load_bench.json"
    code = load_bench.main(["--clients", "2", "--uploads", "1", "--log-mb", "0.3", "--sidecars", "2",
                            "--live-rate", "200", "--live-min-s", "8", "--down-s", "4", "--out", str(out),
                            "--keep-dir", str(tmp_path / "run")])
    result = json.loads(out.read_text())
    assert result["database_restart"]["db_down_s"] >= 4, "the database was restarted while the workloads ran"
    # 503 from the probe's first check after the stop on (it checks every second)
    assert [r["answers_while_down"] for r in result["database_restart"]["replicas"]] == [[503], [503]]
    assert all(r["unhealthy_after_s"] <= 2.5 for r in result["database_restart"]["replicas"])
    assert result["errors"] == 0 and result["store"]["lost"] == 0 and result["server_errors"] == 0
    live = result["live"]
    assert live["sidecar_retries"], "the sidecars met the outage"
    store = live["store"]
    assert store["problems"] == [] and store["lost_lines"] == 0 and store["duplicated_lines"] == 0
    assert store["files"] == store["files_exactly_once"] == 18 and store["lines_written"] > 0
    assert [(j["exit_code"], j["status"], j["reason"]) for j in live["jobs"]] == [
        (1, "failed", "ecc_error"), (1, "failed", "out_of_memory")]
    assert live["diagnosis_same_as_quiet"] == 2 and not live["sidecar_unexpected_messages"]
    assert code == 0


def test_a_service_started_before_its_database_waits_for_it(cluster, tmp_path) -> None:
    """`faultline serve` while PostgreSQL is still down: one line per retry (no traceback), and
    it serves once the database is up; with the database down for good, one error line and
    exit 2 after FAULTLINE_DB_START_WAIT_S."""
    import subprocess
    import sys
    import time

    from tests.support.server import free_port

    url = cluster.create_database("late")
    cluster.stop("fast")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(FAULTLINE_DATABASE_URL=url, FAULTLINE_ADMIN_ENABLED="false", FAULTLINE_DATA_DIR=str(tmp_path),
               FAULTLINE_PRELOAD_FAILURE_AGENT="false", FAULTLINE_DB_START_WAIT_S="120", PYTHONPATH=str(ROOT))
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "cannot be reached" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            cluster.start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()["database"] == "ok"
        finally:
            server.terminate()
            server.wait(timeout=30)
    said = log.read_text()
    assert "cannot be reached" in said and "Traceback" not in said

    cluster.stop("fast")
    env["FAULTLINE_DB_START_WAIT_S"] = "2"
    done = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--port", str(port)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("faultline: error: the database at ")
    assert "cannot be reached after 2 s" in done.stderr
