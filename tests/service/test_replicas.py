"""Several replicas on one database, as real `faultline serve` processes (one of them with two
uvicorn workers): a rule approved on one is in force on all, concurrent uploads are each
stored once, and a retried upload (same Idempotency-Key, any replica) is never stored twice.
On SQLite (one file, several processes) and on PostgreSQL, as the run says."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import func, select

from service.store.db import Database
from service.store.models import Job, KeptLineRow
from tests.service.test_http import LOG, ROOT_LINE
from tests.support.databases import new_database
from tests.support.processes import serve_process
from tests.support.server import health_when

TOKEN = "replica-admin-7c1f3e9a2b5d"
STORAGE_LINE = "[rank5]: helixfs.BucketGoneError: object store bucket 'ckpt-7b' answered 410 for shard 00017"
STORAGE_LOG = LOG.replace("[default3]:KeyError: 'optimizer_config'", STORAGE_LINE)
STORAGE_RULE = {
    "id": "site.helixfs-bucket-gone", "kind": "diagnosis", "reason": "s3_storage_error", "tier": "cause",
    "patterns": [r"helixfs\.BucketGoneError: object store bucket"], "scope": "global",
    "description": "our object store lost a checkpoint bucket",
    "mitigation": "Restore the bucket, then restart from the last checkpoint.",
    "examples": [STORAGE_LINE], "counter_examples": ["helixfs: bucket 'ckpt-7b' mounted"],
}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[dict]:
    url, drop = new_database()
    folder = tmp_path_factory.mktemp("replicas")
    common = {"FAULTLINE_DATABASE_URL": url, "FAULTLINE_ADMIN_TOKEN": TOKEN}
    try:
        with serve_process({**common, "FAULTLINE_DATA_DIR": str(folder / "a")}, workers=2,
                           log_path=folder / "a.log") as a, \
             serve_process({**common, "FAULTLINE_DATA_DIR": str(folder / "b")}, log_path=folder / "b.log") as b:
            db = Database(url)
            try:
                yield {"a": a.url, "b": b.url, "db": db}
            finally:
                db.close()
    finally:
        drop()


def diagnose(url: str, text: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/diagnose", content=text, headers={"Content-Type": "text/plain", **kwargs.pop(
        "headers", {})}, timeout=120, **kwargs)


def admin(url: str, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", headers={"Authorization": f"Bearer {TOKEN}",
                                                         **kwargs.pop("headers", {})}, timeout=60, **kwargs)


def test_a_rule_approved_on_one_replica_is_in_force_on_every_worker_of_the_others(replicas) -> None:
    a, b = replicas["a"], replicas["b"]
    before = [diagnose(a, STORAGE_LOG).json() for _ in range(4)]
    assert all(d["root_cause"]["source"] != f"rule:{STORAGE_RULE['id']}" for d in before)
    version = httpx.get(f"{a}/healthz", timeout=10).json()["rules_version"]
    pack = yaml.safe_dump({"rules": [STORAGE_RULE]})
    r = admin(b, "POST", "/admin/rules/import", content=pack, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 200 and r.json()["created"] == [STORAGE_RULE["id"]], r.text
    r = admin(b, "POST", f"/admin/rules/{STORAGE_RULE['id']}/approve", json={"note": "seen on three jobs"})
    assert r.status_code == 200, r.text
    # replica a runs two worker processes: every request may land on either, all must see it
    after = [diagnose(a, STORAGE_LOG).json() for _ in range(8)]
    assert {d["root_cause"]["source"] for d in after} == {f"rule:{STORAGE_RULE['id']}"}
    assert {d["root_cause"]["line"] for d in after} == {STORAGE_LINE}
    assert health_when(a, lambda r: r.json()["rules_version"] > version, timeout_s=10).json()["rules_version"] > version


def test_concurrent_uploads_to_both_replicas_are_each_stored_once(replicas) -> None:
    a, b, db = replicas["a"], replicas["b"], replicas["db"]
    names = [f"llama-8b-sft-20250301-r{i:02d}" for i in range(24)]

    def upload(i: int) -> dict:
        r = httpx.post(f"{(a, b)[i % 2]}/diagnose", params={"job_name": names[i]}, content=LOG,
                       headers={"Content-Type": "text/plain"}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(upload, range(len(names))))
    assert len({r["job_id"] for r in results}) == len(names)
    assert {r["root_cause"]["line"] for r in results} == {ROOT_LINE}
    with db.session() as session:
        stored = session.execute(select(Job.name, func.count()).where(Job.name.in_(names)).group_by(Job.name)).all()
        assert dict(stored) == dict.fromkeys(names, 1)
        kept = session.scalar(select(func.count()).select_from(KeptLineRow).where(
            KeptLineRow.job_id.in_([r["job_id"] for r in results])))
        assert kept == len(names) * results[0]["compression"]["lines_kept"]
    for url in (a, b):  # each replica reads what the other stored
        for result in results[:4]:
            job = httpx.get(f"{url}/jobs/{result['job_id']}", timeout=10).json()
            assert job["diagnosis"]["root_cause"] == result["root_cause"]


def test_a_retried_upload_is_stored_once_whichever_replica_it_reaches(replicas) -> None:
    a, b, db = replicas["a"], replicas["b"], replicas["db"]
    name = "qwen-14b-pretrain-20250302-retry"
    key = "upload-5b1d0c7e-retry"

    def upload(i: int) -> httpx.Response:
        return httpx.post(f"{(a, b)[i % 2]}/diagnose", params={"job_name": name}, content=LOG,
                          headers={"Content-Type": "text/plain", "Idempotency-Key": key}, timeout=120)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(upload, range(6)))
    assert [r.status_code for r in responses] == [200] * 6, [r.text for r in responses]
    assert len({r.json()["job_id"] for r in responses}) == 1
    assert all(r.json() == responses[0].json() for r in responses)
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.name == name)) == 1
    later = upload(1)
    assert later.json() == responses[0].json()
    other = httpx.post(f"{a}/diagnose", params={"job_name": name}, content=LOG,
                       headers={"Content-Type": "text/plain", "Idempotency-Key": key + "-2"}, timeout=120)
    assert other.json()["job_id"] != responses[0].json()["job_id"]


def test_replicas_log_nothing_alarming(replicas, tmp_path_factory) -> None:
    """The processes' own output: no traceback from a race between replicas."""
    folder = Path(str(tmp_path_factory.getbasetemp()))
    logs = [p.read_text(errors="replace") for p in folder.glob("replicas*/*.log")]
    assert logs and not any("Traceback" in text for text in logs)
