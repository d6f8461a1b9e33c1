"""Job API tokens with scopes (FAULTLINE_API_TOKENS), against a real uvicorn server on loopback:
with tokens configured no job route answers without a valid token (401) or with the wrong
scope (403); the sidecar sends its token; `serve` never exposes an open API by accident."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.cli import main
from service.errors import ConfigError
from service.settings import Settings
from tests.service.test_sidecar import env_for, tail
from tests.support.server import running_server

INGEST = "ing-3f9a1c7e5b2d8046"
READ = "rd-8b2e6c4a1f9d7035"
BOTH = "both-5d1f7a3c9e2b6048"
ADMIN = "ops-2c7e9a4b6d1f8053"
TOKENS = f"cluster-a:ingest:{INGEST},grafana:read:{READ},sidecar:ingest+read:{BOTH},ops:admin:{ADMIN}"
LOG = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nKeyError: 'optimizer_config'\n"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    settings = Settings(data_dir=tmp_path_factory.mktemp("access"), admin_token="adm-9d3b7f1e5a2c8064",
                        api_tokens=TOKENS)
    with running_server(settings) as url:
        yield url


@pytest.fixture(scope="module")
def job_id(server: str) -> str:
    r = httpx.post(f"{server}/diagnose", content=LOG, headers={"Content-Type": "text/plain", **bearer(INGEST)},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["job_id"]


# (method, path, scope it needs); {job} is a stored job's id
ROUTES = [
    ("POST", "/diagnose", "ingest"),
    ("POST", "/jobs", "ingest"),
    ("POST", "/jobs/{job}/logs?source=a.log&offset=0", "ingest"),
    ("POST", "/jobs/{job}/finish", "ingest"),
    ("GET", "/jobs", "read"),
    ("GET", "/jobs/{job}", "read"),
    ("GET", "/jobs/{job}/sources", None),  # read or ingest: the sidecar resumes from it
]


def call(server: str, method: str, path: str, job: str, headers: dict[str, str]) -> httpx.Response:
    url = server + path.format(job=job)
    if method == "GET":
        return httpx.get(url, headers=headers, timeout=30)
    if path == "/jobs":
        return httpx.post(url, json={"name": "probe"}, headers=headers, timeout=30)
    return httpx.post(url, content=b"x\n", headers={"Content-Type": "text/plain", **headers}, timeout=30)


@pytest.mark.parametrize(("method", "path", "scope"), ROUTES)
def test_no_job_route_answers_without_a_valid_token(server: str, job_id: str, method: str, path: str,
                                                    scope: str | None) -> None:
    for headers in ({}, bearer("not-a-known-token-0000"), {"Authorization": f"Basic {READ}"}):
        r = call(server, method, path, job_id, headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
    if scope is None:
        return
    wrong = READ if scope == "ingest" else INGEST
    r = call(server, method, path, job_id, bearer(wrong))
    assert r.status_code == 403 and f"'{scope}'" in r.json()["error"], r.text


def test_a_token_with_the_scope_gets_in(server: str, job_id: str) -> None:
    job = httpx.get(f"{server}/jobs/{job_id}", headers=bearer(READ), timeout=10)
    assert job.status_code == 200 and job.json()["diagnosis"]["root_cause"]["line"] == "KeyError: 'optimizer_config'"
    assert httpx.get(f"{server}/jobs", headers=bearer(ADMIN), timeout=10).status_code == 200  # admin may do all
    live = httpx.post(f"{server}/jobs", json={"name": "live-probe"}, headers=bearer(INGEST), timeout=10)
    assert live.status_code == 201
    # the sidecar resumes from what the server holds with its ingest token
    sources = httpx.get(f"{server}/jobs/{live.json()['id']}/sources", headers=bearer(INGEST), timeout=10)
    assert sources.status_code == 200


def test_health_stays_open(server: str) -> None:
    assert httpx.get(f"{server}/healthz", timeout=10).status_code == 200


def test_an_admin_scoped_api_token_is_an_admin_token_named_in_the_audit(server: str) -> None:
    assert httpx.get(f"{server}/admin/rules", headers=bearer(READ), timeout=10).status_code == 403
    assert httpx.get(f"{server}/admin/rules/export", headers=bearer(ADMIN), timeout=30).status_code == 200
    audit = httpx.get(f"{server}/admin/audit", params={"actor": "ops"}, headers=bearer(ADMIN), timeout=10).json()
    assert [e["action"] for e in audit["data"]] == ["rules.export"]


@pytest.mark.parametrize("token_from", ["env", "file"])
def test_the_sidecar_sends_its_token(server: str, tmp_path: Path, token_from: str) -> None:
    log = tmp_path / "rank0.log"
    log.write_text(LOG)
    env = env_for(tmp_path)
    args = ["--once", str(log)]
    if token_from == "env":
        env["FAULTLINE_TOKEN"] = BOTH
    else:
        (tmp_path / "token").write_text(BOTH + "\n")
        args = ["--token-file", str(tmp_path / "token"), *args]
    name = f"sidecar-token-{token_from}"
    proc = tail(server, name, *args, env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    found = httpx.get(f"{server}/jobs", params={"name": name}, headers=bearer(READ), timeout=10).json()["data"]
    assert found and found[0]["lines_received"] == 3


@pytest.mark.parametrize(("value", "message"), [
    ("cluster-a:ingest", "name:scopes:token"),
    ("cluster-a::" + INGEST, "name:scopes:token"),
    (f"cluster-a:write:{INGEST}", "unknown scope"),
    ("cluster-a:ingest:changeme", "placeholder"),
    (f"a:ingest:{INGEST},a:read:{READ}", "unique"),
])
def test_a_malformed_token_list_stops_the_service(value: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings(data_dir=tmp_path, admin_enabled=False, api_tokens=value).require_admin_token()


def test_serve_refuses_an_open_api_on_a_public_address(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAULTLINE_ADMIN_ENABLED", "false")
    assert main(["serve", "--host", "0.0.0.0", "--port", "9"]) == 2
    err = capsys.readouterr().err
    assert "FAULTLINE_API_TOKENS" in err and "--insecure" in err


def test_serve_on_a_public_address_starts_with_tokens_or_when_told_insecure(tmp_path: Path) -> None:
    """A child process: it gets past the check and answers /healthz (on loopback, which
    0.0.0.0 includes)."""
    from tests.support.server import free_port

    for extra_env, flags in (({"FAULTLINE_API_TOKENS": TOKENS}, []), ({}, ["--insecure"])):
        port = free_port()
        env = {**env_for(tmp_path), "FAULTLINE_ADMIN_ENABLED": "false", **extra_env}
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--host", "0.0.0.0", "--port",
                                 str(port), *flags], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            import time

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert proc.poll() is None, proc.communicate()[1].decode()
            r = httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=5)
            assert r.status_code == (401 if extra_env else 200)
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.communicate(timeout=30)
