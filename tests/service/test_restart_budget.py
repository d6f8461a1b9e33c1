"""The restart budget through the API, on a real server: attempts that share an external_id
(`POST /diagnose?external_id=`, live jobs of one scheduler id) and keep failing the same way
with no progress end in `action: stop`; progress between failures starts the count again."""

from __future__ import annotations

import httpx
import pytest

from service.settings import Settings
from tests.service.test_live_api import ECC, NODE, Job
from tests.support.server import running_server

TIMEOUT = ("[rank3]:[E1128 21:12:50.390000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
           "milliseconds before timing out.")


def steps(upto: int) -> str:
    return "".join(
        f" iteration {n:8d}/  500000 | consumed samples: {n * 128:12d} | elapsed time per iteration (ms): 1234.5 | "
        f"learning rate: 1.500E-04 | global batch size:   128 | lm loss: 2.345678E+00 | loss scale: 65536.0 | "
        "grad norm: 0.512 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
        for n in range(upto - 4, upto + 1))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    settings = Settings(data_dir=tmp_path_factory.mktemp("budget"), admin_enabled=False, restart_budget=3,
                        failure_agent=False)
    with running_server(settings) as url:
        yield url


def diagnose(url: str, log: str, external_id: str) -> dict:
    r = httpx.post(f"{url}/diagnose", params={"job_name": "gpt-7b", "external_id": external_id}, content=log,
                   headers={"Content-Type": "text/plain"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_uploads_of_one_job_stop_at_the_budget(server: str) -> None:
    log = steps(100) + TIMEOUT + "\n"
    answers = [diagnose(server, log, "slurm-4242") for _ in range(3)]
    assert [(a["attempt"], a["recurrence"], a["action"]) for a in answers] == [
        (1, 1, "restart"), (2, 2, "restart"), (3, 3, "stop")]
    stored = httpx.get(f"{server}/jobs/{answers[2]['job_id']}", timeout=10).json()
    assert stored["external_id"] == "slurm-4242" and stored["diagnosis"]["action"] == "stop"
    # another job id has its own count; progress resets it
    assert diagnose(server, log, "slurm-4243")["recurrence"] == 1
    assert diagnose(server, steps(900) + TIMEOUT + "\n", "slurm-4242")["recurrence"] == 1


def test_a_node_with_ecc_errors_is_cordoned_each_time_until_no_progress_stops_it(server: str) -> None:
    """The issue's case: the same ECC node in three attempts of one external id. Training on
    between them, each is a cordon and a restart; with no progress between them, the third
    is a stop (the cordon did not take, or the fault follows the job)."""
    progressing = [diagnose(server, steps(100 * n) + ECC + "\n", "slurm-5150") for n in (1, 2, 3)]
    assert [(a["action"], a["suspect_nodes"], a["recurrence"]) for a in progressing] == [
        ("cordon_and_restart", [NODE], 1)] * 3
    stuck = [diagnose(server, steps(100) + ECC + "\n", "slurm-5151") for _ in range(3)]
    assert [(a["action"], a["recurrence"]) for a in stuck] == [
        ("cordon_and_restart", 1), ("cordon_and_restart", 2), ("stop", 3)]
    assert stuck[2]["mitigation"].startswith(f"Stop restarting: the last 3 attempts of this job all ended in ecc_error on {NODE}")


def test_live_attempts_of_one_scheduler_id_stop_at_the_budget(server: str) -> None:
    finals = []
    for _ in range(3):
        job = Job(server, external_id="k8s-pod-77")
        assert job.send("rank3.log", (steps(50) + TIMEOUT + "\n").encode()).status_code == 200
        assert job.finish(1).status_code == 200
        finals.append(job.get()["diagnosis"])
    assert [(d["attempt"], d["recurrence"], d["action"]) for d in finals] == [
        (1, 1, "restart"), (2, 2, "restart"), (3, 3, "stop")]
    assert "Stop restarting" in finals[2]["mitigation"]
