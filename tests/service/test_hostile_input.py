"""Hostile and broken uploads against a real server: each protection has a test here (or in
test_http.py / test_ingest.py) that fails when the protection is taken out.

Limits, gzip bombs, binary and non-UTF-8 bodies, a 10 MB line, 100,000 ranks, empty logs.
Prompt injection and secrets, with an LLM configured, are in test_hostile_llm.py."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select

from rules.classifier import RANKS_PER_RULE
from service.store.db import Database
from service.ingest.lines import MAX_LINE_BYTES
from service.store.models import KeptLineRow
from rules.job import COMPRESSED_HEAD_LINES, COMPRESSED_TAIL_LINES, JobMeta, JobRun
from rules.rulebook import Rulebook
from service.settings import Settings
from tests.service.test_http import LOG, ROOT_LINE
from tests.support.server import running_server

LIMIT = 2_000_000
ECC_LINE = "[rank77777]: RuntimeError: CUDA error: uncorrectable ECC error encountered"


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[dict]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("hostile"), admin_enabled=False, max_request_bytes=LIMIT)
    with running_server(settings) as url:
        db = Database(settings.database_url)
        try:
            yield {"url": url, "db": db}
        finally:
            db.close()


def post(url: str, **kwargs) -> httpx.Response:
    kwargs.setdefault("headers", {"Content-Type": "text/plain"})
    return httpx.post(f"{url}/diagnose", timeout=300, **kwargs)


def error_of(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text[:500]
    body = r.json()
    assert body["status"] == status
    return body["error"]


# -- size limits -------------------------------------------------------------------------------
def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(service) -> None:
    body = b"[default0]: iteration 1/10 | lm loss: 2.0 |\n" * (LIMIT // 40)
    assert "request body of %d bytes exceeds" % len(body) in error_of(post(service["url"], content=body), 413)


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(service) -> None:
    sent = []

    def body() -> Iterator[bytes]:
        for _ in range(200):  # 200 x 64 KB = 12.8 MB, far past the 2 MB limit
            sent.append(1)
            yield b"[default0]: iteration 1/10 | lm loss: 2.0 |\n" * 1400

    assert "exceeds the limit of 2000000 bytes" in error_of(post(service["url"], content=body()), 413)


def test_a_multipart_body_over_the_limit_is_refused(service) -> None:
    files = [("files", (f"node-{i}.log", b"[default0]: iteration 1/10 | lm loss: 2.0 |\n" * 20_000, "text/plain"))
             for i in range(3)]
    assert "exceeds the limit" in error_of(post(service["url"], files=files, headers={}), 413)


# -- gzip bombs and binary -------------------------------------------------------------------------
def test_a_gzip_bomb_inside_a_multipart_file_is_refused(service) -> None:
    bomb = gzip.compress(b"\n" * 60_000_000)  # ~60 KB that expands 1000x
    files = [("files", ("rank0.log", LOG.encode(), "text/plain")), ("files", ("rank1.log.gz", bomb, "application/gzip"))]
    assert "expands more than 200x" in error_of(post(service["url"], files=files, headers={}), 413)


def test_a_malformed_multipart_part_header_is_the_clients_error(service) -> None:
    # a control character in a part's header made the parser raise through to a 500 (found
    # by the schema fuzz test)
    body = b'--b0\r\nContent-Dis\x1cposition: form-data; name="files"; filename="r0.log"\r\n\r\nstep 1\r\n--b0--\r\n'
    r = post(service["url"], content=body, headers={"Content-Type": "multipart/form-data; boundary=b0"})
    assert "malformed multipart body" in error_of(r, 400)


def test_binary_inside_gzip_is_refused(service) -> None:
    packed = gzip.compress(bytes(range(256)) * 64)
    r = post(service["url"], content=packed, headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"})
    assert "binary" in error_of(r, 400)


def test_a_non_utf8_log_is_diagnosed_with_its_bad_bytes_replaced(service) -> None:
    latin1 = "[default0]: Température GPU élevée, données chargées\n".encode("latin-1")
    broken = b"[default3]: \xff\xfe\xc3(\x80 checkpoint shard name garbled\n"
    body = latin1 + broken + LOG.encode()
    r = post(service["url"], content=body)
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["root_cause"]["line"] == ROOT_LINE and result["root_cause"]["line_number"] == 11
    assert result["compression"]["lines_in"] == 12
    with service["db"].session() as session:
        texts = session.scalars(select(KeptLineRow.text).where(KeptLineRow.job_id == result["job_id"])).all()
    assert "[default0]: Temp\ufffdrature GPU \ufffdlev\ufffde, donn\ufffdes charg\ufffdes" in texts


# -- one 10 MB line -----------------------------------------------------------------------------------
def test_a_10mb_single_line_is_cut_and_the_log_still_diagnosed(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path, admin_enabled=False)  # the default limit (2 GB)
    giant = "[default0]: {'tokens': [" + "50256, " * (10 * 1024 * 1024 // 7) + "]}"
    body = (giant + "\n" + ECC_LINE + "\n").encode()
    assert len(body) > 10 * 1024 * 1024
    with running_server(settings) as url:
        r = post(url, content=body)
        assert r.status_code == 200, r.text[:300]
        result = r.json()
    assert result["root_cause"]["line"] == ECC_LINE and result["root_cause"]["line_number"] == 2
    assert result["compression"]["lines_in"] == 2 and result["compression"]["lines_cut"] == 1
    db = Database(settings.database_url)
    try:
        with db.session() as session:
            lengths = session.scalars(select(KeptLineRow.text).where(KeptLineRow.job_id == result["job_id"])).all()
    finally:
        db.close()
    assert max(len(text) for text in lengths) <= MAX_LINE_BYTES


# -- 100,000 ranks -------------------------------------------------------------------------------------
def hundred_thousand_ranks() -> bytes:
    """A 100,000-GPU job at the moment one GPU fails: every rank's NCCL INFO line, the
    watchdog timeouts of a tenth of them, and the one ECC error that explains them."""
    lines = [f"[rank{r}]:gpu-{r // 8:05d}:{4100 + r % 8}:{4100 + r % 8} [{r % 8}] NCCL INFO NET/IB : Using "
             f"[0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ibp12s0:10.149.{r // 256 % 256}.{r % 256}<0>" for r in range(100_000)]
    lines += [f"[rank{r}]:[E ProcessGroupNCCL.cpp:1484] [PG 0 Rank {r}] Watchdog caught collective operation "
              f"timeout: WorkNCCL(SeqNum=5214, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
              f"for 600081 milliseconds before timing out." for r in range(0, 100_000, 10)]
    lines.insert(100_000, ECC_LINE)
    return ("\n".join(lines) + "\n").encode()


def test_100000_ranks_give_one_answer_of_bounded_size(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path, admin_enabled=False)
    with running_server(settings) as url:
        r = post(url, content=hundred_thousand_ranks(), params={"framework": "megatron"})
    assert r.status_code == 200, r.text[:300]
    result = r.json()
    assert result["root_cause"]["line"] == ECC_LINE and result["root_cause"]["rank"] == 77777
    assert [(e["reason"], e["count"]) for e in result["other_errors"]] == [("nccl_timeout", 10_000)]
    assert result["compression"]["lines_in"] == 110_001
    assert len(json.dumps(result)) < 16_384


def test_100000_ranks_cost_bounded_memory_in_the_classifier(builtin_rulebook) -> None:
    run = JobRun(builtin_rulebook, JobMeta(framework="megatron"))
    data = hundred_thousand_ranks()
    start = 0
    while start < len(data):  # whole-line buffers of about 4 MB, as ingest makes them
        end = data.rfind(b"\n", start, start + (4 << 20)) + 1 or len(data)
        run.feed("job.log", data[start:end])
        start = end
    (timeouts,) = [found for found in run.classifier.found.values() if found.rule.reason == "nccl_timeout"]
    assert timeouts.count == 10_000 and len(timeouts.ranks) == RANKS_PER_RULE
    assert len(run.compressed.lines()) <= COMPRESSED_HEAD_LINES + COMPRESSED_TAIL_LINES


# -- empty logs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"content": b""}, "empty log"),
    ({"content": gzip.compress(b""), "headers": {"Content-Type": "text/plain", "Content-Encoding": "gzip"}},
     "empty log"),
    ({"files": [("files", ("rank0.log", b"", "text/plain"))], "headers": {}}, "empty log"),
    ({"files": [("note", (None, b"not a file"))], "headers": {}}, "no file part"),
])
def test_empty_logs_are_a_clear_400(service, kwargs, message) -> None:
    assert message in error_of(post(service["url"], **kwargs), 400)


# -- many clients at once ------------------------------------------------------------------------------
def test_uploads_past_the_concurrency_limit_wait_and_health_still_answers(tmp_path) -> None:
    import threading
    import time

    settings = Settings(data_dir=tmp_path, admin_enabled=False, max_concurrent_uploads=1)
    release, first_sent = threading.Event(), threading.Event()
    done: dict[str, float] = {}

    def slow_body() -> Iterator[bytes]:
        yield LOG.encode()[:200]
        first_sent.set()
        release.wait(30)
        yield LOG.encode()[200:]

    def send(name: str, body) -> None:
        r = httpx.post(f"{url}/diagnose", content=body, headers={"Content-Type": "text/plain"}, timeout=60)
        assert r.status_code == 200, r.text
        done[name] = time.monotonic()

    with running_server(settings) as url:
        slow = threading.Thread(target=send, args=("slow", slow_body()))
        slow.start()
        assert first_sent.wait(10)
        time.sleep(0.5)  # the slow upload holds the one slot
        quick = threading.Thread(target=send, args=("quick", LOG))
        quick.start()
        quick.join(2.0)
        assert "quick" not in done  # waiting for the slot, its body unread
        started = time.monotonic()
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0
        release.set()
        slow.join(30)
        quick.join(30)
    assert done["slow"] <= done["quick"]


def test_a_nul_character_in_a_query_or_a_body_is_the_callers_error(service) -> None:
    # PostgreSQL text cannot hold NUL: the database refuses the value, the service says so (422)
    # instead of failing with a 500; SQLite stores it, so there the request simply succeeds
    url = service["url"]
    responses = [httpx.get(f"{url}/jobs", params={"name": "gpt\x00-7b"}, timeout=60),
                 httpx.post(f"{url}/jobs", json={"name": "gpt\x00-7b"}, timeout=60)]
    for r in responses:
        assert r.status_code in (200, 201, 422), r.text[:300]
        if r.status_code == 422:
            assert "cannot be stored" in r.json()["error"] and "SELECT" not in r.json()["error"]


def test_a_client_gone_before_its_body_ends_stores_nothing_and_leaves_no_traceback(service) -> None:
    import logging
    import socket
    import time
    from urllib.parse import urlsplit

    class Lines(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    seen = Lines()
    watched = [logging.getLogger(name) for name in ("uvicorn.error", "faultline.requests")]
    for logger in watched:
        logger.addHandler(seen)
    try:
        address = urlsplit(service["url"])
        body = b"step 1 loss 2.0\n" * 1000
        with socket.create_connection((address.hostname, address.port)) as sock:
            sock.sendall(b"POST /diagnose?job_name=gone-mid-body HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                         b"Content-Length: %d\r\n\r\n" % (10 * len(body)) + body)
            time.sleep(0.3)
        deadline = time.monotonic() + 10
        while not any("abandoned" in r.getMessage() for r in seen.records) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for logger in watched:
            logger.removeHandler(seen)
    assert [r.getMessage() for r in seen.records if r.levelno >= logging.ERROR] == []
    assert any("abandoned by its client" in r.getMessage() for r in seen.records)
    assert httpx.get(f"{service['url']}/jobs", params={"name": "gone-mid-body"}).json()["count"] == 0


def test_an_upload_in_utf16_is_diagnosed_like_its_utf8_text(service) -> None:
    r = post(service["url"], content=LOG.encode("utf-16"))
    assert r.status_code == 200, r.text[:300]
    assert r.json()["root_cause"]["line"] == ROOT_LINE


def test_a_client_gone_before_the_answer_stores_nothing(service) -> None:
    """The whole body sent, then the client left (its timeout on a big upload): no one reads
    the answer, and a retry must not find a job it never got."""
    import socket
    import time
    from urllib.parse import urlsplit

    address = urlsplit(service["url"])
    body = "".join(f"[rank0]: step {i} loss 2.{i % 97:02d} lr 3e-4 tokens/s 311200\n" for i in range(28000)).encode()
    assert len(body) < LIMIT
    with socket.create_connection((address.hostname, address.port)) as sock:
        sock.sendall(b"POST /diagnose?job_name=gone-before-answer HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(2)
    assert httpx.get(f"{service['url']}/jobs", params={"name": "gone-before-answer"}).json()["count"] == 0
