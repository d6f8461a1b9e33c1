"""POST /diagnose and job lookup against a real uvicorn server on loopback."""

from __future__ import annotations

import gzip
from datetime import datetime, timedelta

import httpx
import pytest

from service.settings import Settings
from tests.support.server import running_server

LOG = "\n".join([
    "[default0]:WARNING:torch.distributed.run:",
    "[default0]:*****************************************",
    "[default0]: [2025-03-31 05:54:07] iteration       50/  242204 | consumed samples:        50400 | elapsed time per iteration (ms): 1552.8 | learning rate: 8.000000E-06 | global batch size:  1008 | lm loss: 6.258318E+00 | loss scale: 1.0 | grad norm: 1.520 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "[default3]:Traceback (most recent call last):",
    '[default3]:  File "/workspace/Megatron-LM/pretrain_gpt.py", line 243, in <module>',
    "[default3]:    pretrain(train_valid_test_datasets_provider,",
    '[default3]:  File "/workspace/Megatron-LM/megatron/training/training.py", line 282, in pretrain',
    "[default3]:    args = get_args()['optimizer_config']",
    "[default3]:KeyError: 'optimizer_config'",
    "E1128 21:12:50.390000 3139541 site-packages/torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 3 (pid: 3139623) of binary: /usr/bin/python3",
]) + "\n"
ROOT_LINE = "[default3]:KeyError: 'optimizer_config'"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    data = tmp_path_factory.mktemp("http-data")
    settings = Settings(data_dir=data, admin_token="test-admin-token-5f2c9a1e7b", max_request_bytes=2_000_000)
    with running_server(settings) as url:
        yield url


def test_plain_text_log_is_diagnosed_and_stored(server: str) -> None:
    r = httpx.post(f"{server}/diagnose", params={"job_name": "gpt-7b-20241103-ab12cd", "framework": "megatron"},
                   content=LOG, headers={"Content-Type": "text/plain"}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "failed"
    assert body["root_cause"]["line"] == ROOT_LINE
    assert body["root_cause"]["line_number"] == 9
    assert body["compression"]["lines_in"] == 10
    assert body["compression"]["bytes_in"] == len(LOG.encode())
    job = httpx.get(f"{server}/jobs/{body['job_id']}", timeout=10).json()
    assert job["id"] == body["job_id"] and job["name"] == "gpt-7b-20241103-ab12cd"
    assert job["status"] == "failed" and job["lines_received"] == 10
    assert job["diagnosis"]["root_cause"] == body["root_cause"]
    found = httpx.get(f"{server}/jobs", params={"name": "gpt-7b-20241103-ab12cd"}, timeout=10).json()
    assert body["job_id"] in [j["id"] for j in found["data"]]


def test_gzip_body_gives_the_same_diagnosis(server: str) -> None:
    plain = httpx.post(f"{server}/diagnose", content=LOG, headers={"Content-Type": "text/plain"}, timeout=60).json()
    packed = httpx.post(f"{server}/diagnose", content=gzip.compress(LOG.encode()),
                        headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"}, timeout=60).json()
    assert packed["root_cause"]["line"] == plain["root_cause"]["line"]
    assert packed["compression"]["lines_in"] == plain["compression"]["lines_in"]


def test_multipart_files_are_one_job_with_several_sources(server: str) -> None:
    rank0 = "\n".join(LOG.splitlines()[:3]) + "\n"
    rank3 = "\n".join(LOG.splitlines()[3:]) + "\n"
    files = [("files", ("node-0.log", rank0.encode(), "text/plain")),
             ("files", ("node-1.log.gz", gzip.compress(rank3.encode()), "application/gzip"))]
    r = httpx.post(f"{server}/diagnose", files=files, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["root_cause"]["file"] == "node-1.log.gz"
    assert body["root_cause"]["line_number"] == 6
    assert body["compression"]["lines_in"] == 10


@pytest.mark.parametrize(("kwargs", "status", "message"), [
    ({"content": b"", "headers": {"Content-Type": "text/plain"}}, 400, "empty log"),
    ({"content": bytes(range(256)) * 40, "headers": {"Content-Type": "text/plain"}}, 400, "binary"),
    ({"content": b"{}", "headers": {"Content-Type": "application/json"}}, 415, "Content-Type"),
    ({"content": b"x\n", "headers": {"Content-Type": "text/plain", "Content-Encoding": "br"}}, 415, "Content-Encoding"),
    ({"content": b"\x1f\x8bgarbage" * 20, "headers": {"Content-Type": "text/plain", "Content-Encoding": "gzip"}}, 400, "gzip"),
    ({"content": b"a line of log\n" * 200_000, "headers": {"Content-Type": "text/plain"}}, 413, "limit"),
    ({"content": gzip.compress(b"A" * 50_000_000), "headers": {"Content-Type": "text/plain", "Content-Encoding": "gzip"}}, 413, "expands"),
])
def test_bad_input_gets_a_clear_json_error(server: str, kwargs, status: int, message: str) -> None:
    r = httpx.post(f"{server}/diagnose", timeout=60, **kwargs)
    assert r.status_code == status, r.text
    assert r.json()["status"] == status and message in r.json()["error"]


def test_unknown_job_is_404_and_bad_query_is_422(server: str) -> None:
    r = httpx.get(f"{server}/jobs/does-not-exist", timeout=10)
    assert r.status_code == 404 and "does-not-exist" in r.json()["error"]
    r = httpx.get(f"{server}/jobs", params={"limit": 0}, timeout=10)
    assert r.status_code == 422 and "limit" in r.json()["error"]


def test_healthz_reports_the_database(server: str) -> None:
    assert httpx.get(f"{server}/healthz", timeout=10).json()["database"] == "ok"


def test_a_tagged_upload_is_stored_under_the_family_its_rules_were_scoped_by(server: str) -> None:
    """The run scopes learned rules by a `family:` tag; the stored job must say the same family."""
    r = httpx.post(f"{server}/diagnose", params={"job_name": "gpt-7b-20241103-ab12cd", "tags": "team:x,family:llama-pt"},
                   content=LOG, headers={"Content-Type": "text/plain"}, timeout=60)
    assert r.status_code == 200, r.text
    job = httpx.get(f"{server}/jobs/{r.json()['job_id']}", timeout=10).json()
    assert job["family"] == "llama-pt"
    untagged = httpx.post(f"{server}/diagnose", params={"job_name": "gpt-7b-20241103-ab12cd"},
                          content=LOG, headers={"Content-Type": "text/plain"}, timeout=60).json()
    assert httpx.get(f"{server}/jobs/{untagged['job_id']}", timeout=10).json()["family"] == "gpt-7b"


@pytest.mark.parametrize(("body", "headers", "status", "message"), [
    (bytes(range(256)) * 40, {}, 400, "binary"),
    (gzip.compress(bytes(range(256)) * 40), {"Content-Encoding": "gzip"}, 400, "binary"),
    (b"\x1f\x8bgarbage" * 20, {"Content-Encoding": "gzip"}, 400, "gzip"),
    (b"a line\n", {"Content-Encoding": "br"}, 415, "Content-Encoding"),
])
def test_a_live_append_refuses_the_same_bad_input_as_an_upload(server: str, body: bytes, headers: dict,
                                                                status: int, message: str) -> None:
    """Live appends go through the same decoder as uploads and files: binary is refused and
    nothing of it is stored."""
    job = httpx.post(f"{server}/jobs", json={"name": "live-bad-input"}, timeout=10).json()
    r = httpx.post(f"{server}/jobs/{job['id']}/logs", params={"source": "rank0.log", "offset": 0},
                   content=body, headers={"Content-Type": "text/plain", **headers}, timeout=30)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert httpx.get(f"{server}/jobs/{job['id']}", timeout=10).json()["lines_received"] == 0


def test_a_declared_length_past_the_limit_is_refused_on_both_routes_before_reading(server: str) -> None:
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(server).hostname, urlsplit(server).port
    job = httpx.post(f"{server}/jobs", json={"name": "live-bad-length"}, timeout=10).json()
    for path in ("/diagnose", f"/jobs/{job['id']}/logs?source=a&offset=0"):
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                      f"Content-Length: 5000000000\r\nConnection: close\r\n\r\nabc\n".encode())
            reply = s.recv(4096).decode("latin-1")
        assert reply.startswith("HTTP/1.1 413"), (path, reply[:200])


def test_every_time_the_api_gives_is_utc_with_its_offset(server: str) -> None:
    # SQLite read times back without a zone: POST /jobs said +00:00, GET /jobs/{id} nothing
    created = httpx.post(f"{server}/jobs", json={"name": "gpt-1b-times"}, timeout=10).json()
    httpx.post(f"{server}/jobs/{created['id']}/logs", params={"source": "rank0.log", "offset": 0},
               content=b"step 1 loss 2.5\n", timeout=30).raise_for_status()
    read = httpx.get(f"{server}/jobs/{created['id']}", timeout=10).json()
    listed = httpx.get(f"{server}/jobs", params={"name": "gpt-1b-times"}, timeout=10).json()["data"][0]
    finished = httpx.post(f"{server}/jobs/{created['id']}/finish", json={"exit_code": 0}, timeout=30).json()
    for view in (created, read, listed, finished):
        times = {k: v for k, v in view.items() if k.endswith("_at") and v is not None}
        assert "created_at" in times
        for key, value in times.items():
            assert datetime.fromisoformat(value).utcoffset() == timedelta(0), (key, value)
