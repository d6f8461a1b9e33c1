"""The database restarts under a running service (a private PostgreSQL server: the shared one
is never restarted): /healthz says unhealthy and uploads get 503 while it is down, the first
request after it returns succeeds (pool pre-ping), and nothing stored before is lost."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from service.settings import Settings
from tests.service.test_http import LOG, ROOT_LINE
from tests.support import databases, postgres_cluster
from tests.support.server import running_server

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
        health = httpx.get(f"{url}/healthz", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert health.json()["backend"] == "postgresql"
        refused = post(url, **{"Idempotency-Key": "while-down-1"})
        assert refused.status_code == 503, refused.text
        assert "database unavailable" in refused.json()["error"] and refused.headers["Retry-After"]

        cluster.start()
        # the first requests after the restart get working connections, not the dead ones
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
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
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
