"""Live jobs over HTTP on a real uvicorn server: create, append (idempotent by source, file and
offset; 409 with the expected offset), finish, the diagnosis while the job runs, loss spikes,
concurrent appends, and two replicas sharing one database."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.support.server import running_server

NODE = "lrdn3321"
NCCL_TIMEOUT = ("[{node}:{rank}]:[rank{rank}]:[E817 17:50:34.227531918 ProcessGroupNCCL.cpp:1664] [PG 0 Rank {rank}] "
                "Exception (either an error or timeout) detected by watchdog at work: 7753, last enqueued NCCL work: "
                "7755, last completed NCCL work: 7752.")
ECC = ("[lrdn3321:3]:[rank3]:[E817 17:40:34.227531918 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 3] "
       "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered")


def iteration(step: int, loss: float, *, ms: float = 1552.8, rank: int = 7) -> str:
    return (f"[{NODE}:{rank}]: [2025-03-31 05:{(step // 60) % 60:02d}:{step % 60:02d}] iteration {step:8d}/  242204 | "
            f"consumed samples: {step * 1008:12d} | elapsed time per iteration (ms): {ms:.1f} | "
            f"learning rate: 8.000000E-06 | global batch size:  1008 | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: 1.520 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def saved(step: int, rank: int = 7) -> list[str]:
    return [f"[{NODE}:{rank}]:saving checkpoint at iteration {step:7d} to /ckpt/gpt-7b in torch_dist format",
            f"[{NODE}:{rank}]:  successfully saved checkpoint from iteration {step:7d} to /ckpt/gpt-7b [ t 1/1, p 1/1 ]"]


def text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    settings = Settings(data_dir=tmp_path_factory.mktemp("live-api"), admin_enabled=False, max_chunk_bytes=1 << 20)
    with running_server(settings) as url:
        yield url


class Job:
    """A live job seen from a sidecar's side: keeps each file's offset."""

    def __init__(self, url: str, name: str = "gpt-7b-pretrain-20250331", **body: object):
        self.url = url
        response = httpx.post(f"{url}/jobs", json={"name": name, **body}, timeout=60)
        assert response.status_code == 201, response.text
        self.id = response.json()["id"]
        self.offsets: dict[tuple[str, str], int] = {}

    def send(self, source: str, data: bytes, *, file: str = "f1", offset: int | None = None,
             **headers: str) -> httpx.Response:
        start = self.offsets.get((source, file), 0) if offset is None else offset
        response = httpx.post(f"{self.url}/jobs/{self.id}/logs", params={"source": source, "file": file,
                                                                         "offset": start},
                              content=data, headers=headers, timeout=60)
        if response.status_code == 200:
            self.offsets[(source, file)] = response.json()["next_offset"]
        return response

    def get(self) -> dict:
        return httpx.get(f"{self.url}/jobs/{self.id}", timeout=60).json()

    def finish(self, exit_code: int | None) -> httpx.Response:
        return httpx.post(f"{self.url}/jobs/{self.id}/finish", json={"exit_code": exit_code}, timeout=60)


def test_a_new_live_job_has_the_contract_fields(server: str) -> None:
    job = Job(server, framework="megatron", tags=["team:pretrain"])
    view = job.get()
    assert {"id", "name", "status", "lines_received", "diagnosis"} <= view.keys()
    assert view["id"] == job.id and view["status"] == "running" and view["lines_received"] == 0 and view["live"]
    assert view["diagnosis"]["root_cause"] is None
    found = httpx.get(f"{server}/jobs", params={"name": "gpt-7b-pretrain-20250331"}).json()["data"]
    assert job.id in [j["id"] for j in found]


def test_the_scheduler_id_finds_the_open_job_and_never_a_finished_one(server: str) -> None:
    first = httpx.post(f"{server}/jobs", json={"name": "gpt-13b", "external_id": "slurm-494583"})
    again = httpx.post(f"{server}/jobs", json={"name": "gpt-13b", "external_id": "slurm-494583"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert httpx.post(f"{server}/jobs/{first.json()['id']}/finish", json={"exit_code": 0}).status_code == 200
    requeued = httpx.post(f"{server}/jobs", json={"name": "gpt-13b", "external_id": "slurm-494583"})
    assert requeued.status_code == 201 and requeued.json()["id"] != first.json()["id"]


def test_a_resent_chunk_is_acknowledged_again_and_counted_once(server: str) -> None:
    job = Job(server)
    chunk = text([iteration(s, 2.3) for s in range(1, 101)])
    first = job.send("rank7.log", chunk, offset=0)
    again = job.send("rank7.log", chunk, offset=0)
    assert first.status_code == again.status_code == 200
    assert first.json()["duplicate"] is False and again.json()["duplicate"] is True
    assert again.json()["next_offset"] == len(chunk)
    assert job.get()["lines_received"] == 100
    sources = httpx.get(f"{server}/jobs/{job.id}/sources").json()["data"]
    assert [(s["source"], s["lines"], s["bytes"], s["chunks"]) for s in sources] == [("rank7.log", 100, len(chunk), 1)]


def test_a_line_sent_in_two_parts_is_one_line_received(server: str) -> None:
    """A chunk may end inside a line (the sidecar gave up waiting for its end): the partial
    line is diagnosed at once, and counted once, when the chunk that ends it comes."""
    job = Job(server)
    first = b"step 1 loss 2.5\nstep 2 lo"
    assert job.send("rank7.log", first, offset=0).json()["lines"] == 1
    assert job.send("rank7.log", b"ss 2.4\n", offset=len(first)).json()["lines"] == 1
    assert job.get()["lines_received"] == 2
    sources = httpx.get(f"{server}/jobs/{job.id}/sources").json()["data"]
    assert [(s["lines"], s["bytes"]) for s in sources] == [(2, len(first) + 7)]


def test_a_range_longer_than_its_body_must_say_it_skipped_a_line(server: str) -> None:
    """`end` past offset + body would count bytes never sent as received: refused unless the
    client says the range ends with the skipped rest of an over-long line (cut=1)."""
    job = Job(server)
    body = b"step 1 loss 2.5\n"
    refused = httpx.post(f"{server}/jobs/{job.id}/logs", params={"source": "r0.log", "offset": 0, "end": 1000},
                         content=body, timeout=60)
    assert refused.status_code == 400 and "cut=1" in refused.json()["error"]
    assert job.get()["bytes_received"] == 0
    cut = httpx.post(f"{server}/jobs/{job.id}/logs", params={"source": "r0.log", "offset": 0, "end": 1000, "cut": 1},
                     content=body, timeout=60)
    assert cut.status_code == 200 and cut.json()["next_offset"] == 1000


@pytest.mark.parametrize(("offset", "body", "reason"), [
    (1000, b"a line after a hole\n", "gap"),
    (10, b"a line that starts inside the first chunk\n", "overlap"),
    (0, b"same offset, other length\n", "overlap"),
], ids=["gap", "overlap", "same-offset-other-length"])
def test_gaps_and_overlaps_are_refused_with_the_expected_offset(server: str, offset: int, body: bytes,
                                                               reason: str) -> None:
    job = Job(server)
    first = text([iteration(s, 2.3) for s in range(1, 4)])
    job.send("rank7.log", first)
    refused = job.send("rank7.log", body, offset=offset)
    assert refused.status_code == 409
    detail = refused.json()
    assert detail["reason"] == reason and detail["expected_offset"] == len(first)
    assert f"expects byte {len(first)}" in detail["error"]
    assert job.get()["lines_received"] == 3, "a refused chunk counts nothing"


def test_a_rotated_file_is_a_new_file_of_the_same_source(server: str) -> None:
    job = Job(server)
    job.send("rank7.log", text([iteration(s, 2.3) for s in range(1, 11)]), file="a1.1f.0")
    job.send("rank7.log", text([iteration(s, 2.3) for s in range(11, 21)]), file="b2.2a.0")
    view = job.get()
    assert view["lines_received"] == 20 and view["diagnosis"]["progress"]["last_step"] == 20
    assert len(httpx.get(f"{server}/jobs/{job.id}/sources").json()["data"]) == 2


def test_gzip_chunks_are_decoded_and_bad_chunks_get_clear_errors(server: str) -> None:
    job = Job(server)
    plain = text([iteration(s, 2.3) for s in range(1, 51)])
    packed = job.send("rank7.log", gzip.compress(plain), **{"Content-Encoding": "gzip"})
    assert packed.status_code == 200 and packed.json()["next_offset"] == len(plain)
    cases = [
        (job.send("rank7.log", b"", offset=len(plain)), 400, "empty chunk"),
        (job.send("rank7.log", b"x" * (2 << 20), offset=len(plain)), 413, "limit"),
        (job.send("rank7.log", b"x\n", **{"Content-Encoding": "br"}), 415, "Content-Encoding"),
        (httpx.post(f"{server}/jobs/nosuchjob/logs", params={"source": "a", "offset": 0}, content=b"x\n"), 404, "no job"),
        (httpx.post(f"{server}/jobs/{job.id}/logs", params={"source": "a", "offset": -1}, content=b"x\n"), 422, "offset"),
        # past a 64-bit database integer: a clear 422, not a server error
        (httpx.post(f"{server}/jobs/{job.id}/logs", params={"source": "a", "offset": 2**63}, content=b"x\n"), 422, "offset"),
        (httpx.get(f"{server}/jobs", params={"offset": 2**63}), 422, "offset"),
        (httpx.post(f"{server}/jobs/{job.id}/logs", params={"offset": 0}, content=b"x\n"), 422, "source"),
    ]
    for response, status, words in cases:
        assert response.status_code == status, response.text
        assert words in response.json()["error"]
    assert job.get()["lines_received"] == 50


def test_a_failing_job_is_diagnosed_before_it_finishes(server: str) -> None:
    job = Job(server)
    for step in range(1, 200, 50):
        job.send(f"{NODE}-rank7.log", text([iteration(s, 2.3) for s in range(step, step + 50)]))
    assert job.get()["status"] == "running"
    job.send(f"{NODE}-rank3.log", text([ECC]))
    live = job.get()
    assert live["finished_at"] is None
    assert live["status"] == "failed" and live["diagnosis"]["root_cause"]["reason"] == "ecc_error"
    assert live["diagnosis"]["root_cause"]["line"] == ECC
    assert live["diagnosis"]["action"] == "cordon_and_restart" and live["diagnosis"]["suspect_nodes"] == [NODE]
    # ten minutes later every other rank times out: symptoms, not the cause
    for rank in (0, 1, 2, 4, 5, 6, 7):
        job.send(f"{NODE}-rank{rank}.log", text([NCCL_TIMEOUT.format(node=NODE, rank=rank)]))
    assert job.get()["diagnosis"]["root_cause"]["line"] == ECC
    final = job.finish(1).json()
    assert final["status"] == "failed" and final["exit_code"] == 1 and final["finished_at"]
    assert final["diagnosis"]["root_cause"]["line"] == ECC and final["diagnosis"]["exit_code"] == 1
    assert any(e["reason"] == "nccl_timeout" for e in final["diagnosis"]["other_errors"])


def test_finish_is_final_and_can_be_repeated(server: str) -> None:
    job = Job(server)
    job.send("rank7.log", text([iteration(s, 2.3) for s in range(1, 11)]))
    assert job.finish(0).status_code == 200
    assert job.finish(0).status_code == 200, "a sidecar and an epilog may both report the end"
    assert job.finish(None).status_code == 200
    other = job.finish(1)
    assert other.status_code == 409 and "exit code 0" in other.json()["error"]
    late = job.send("rank7.log", b"one more line\n")
    assert late.status_code == 409 and late.json()["reason"] == "finished"
    assert httpx.post(f"{server}/jobs/nosuchjob/finish", json={}).status_code == 404


@pytest.mark.parametrize(("exit_code", "status", "words"), [
    (0, "healthy", ""),
    (137, "failed", "killed by SIGKILL"),
    (3, "failed", "exited with code 3"),
])
def test_the_exit_status_completes_a_log_that_shows_nothing_wrong(server: str, exit_code: int, status: str,
                                                                 words: str) -> None:
    job = Job(server)
    job.send("rank7.log", text([iteration(s, 2.3) for s in range(1, 21)]))
    final = job.finish(exit_code).json()
    assert final["status"] == status and final["exit_code"] == exit_code
    assert words in final["diagnosis"]["mitigation"]


def test_a_loss_spike_is_reported_live_with_the_rollback_checkpoint(server: str) -> None:
    job = Job(server)
    lines: list[str] = []
    for step in range(1, 301):
        lines.append(iteration(step, 2.4 - step * 1e-3 + (0.01 if step % 2 else -0.01)))
        if step % 100 == 0:
            lines += saved(step)
    job.send("rank7.log", text(lines))
    assert job.get()["diagnosis"]["root_cause"] is None
    # BLOOM-104B style: the loss jumps and stays up
    spike = [iteration(301, 2.9), iteration(302, 4.4)] + [iteration(s, 5.6 + (s % 3) * 0.1) for s in range(303, 380)]
    job.send("rank7.log", text(spike[:20]))
    job.send("rank7.log", text(spike[20:]))
    view = job.get()
    diagnosis = view["diagnosis"]
    assert view["finished_at"] is None
    assert diagnosis["root_cause"]["reason"] == "loss_spike" and diagnosis["action"] == "rollback_and_skip"
    assert diagnosis["root_cause"]["line"] == iteration(302, 4.4)
    assert diagnosis["rollback"]["checkpoint_step"] == 300 and diagnosis["rollback"]["spike_step"] == 302
    assert diagnosis["rollback"]["skip_steps"] == [301, 402]


def test_concurrent_appends_of_one_job_count_every_line_once(server: str) -> None:
    job = Job(server)
    ranks, chunks, per = 4, 12, 40
    bodies = {rank: [text([iteration(c * per + s, 2.3, rank=rank) for s in range(per)]) for c in range(chunks)]
              for rank in range(ranks)}
    errors: list[str] = []

    def ship(rank: int) -> None:
        offset = 0
        with httpx.Client(base_url=server, timeout=60) as client:
            for body in bodies[rank]:
                for _ in range(2):  # every chunk twice, as after a lost acknowledgement
                    r = client.post(f"/jobs/{job.id}/logs", params={"source": f"rank{rank}.log", "offset": offset},
                                    content=body)
                    if r.status_code != 200:
                        errors.append(r.text)
                offset += len(body)

    threads = [threading.Thread(target=ship, args=(rank,)) for rank in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    view = job.get()
    assert view["lines_received"] == ranks * chunks * per
    assert view["diagnosis"]["compression"]["lines_in"] == ranks * chunks * per, "the state saw each line once"


def test_two_replicas_on_one_database_continue_each_others_state(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    settings = Settings(data_dir=data, admin_enabled=False)
    with running_server(settings) as one, running_server(settings) as two:
        job = Job(one)
        replicas = [httpx.Client(base_url=u, timeout=60) for u in (one, two)]
        try:
            _alternate(job, replicas)
        finally:
            for client in replicas:
                client.close()


def _alternate(job: Job, replicas: list[httpx.Client]) -> None:
    """Appends that alternate between the replicas: each must pick up the other's state."""
    offset = 0
    lines = 0
    for i in range(10):
        body = text([iteration(s, 2.3) for s in range(i * 30 + 1, i * 30 + 31)])
        response = replicas[i % 2].post(f"/jobs/{job.id}/logs", params={"source": "rank7.log", "offset": offset},
                                        content=body)
        assert response.status_code == 200, response.text
        offset, lines = response.json()["next_offset"], lines + 30
    for client in replicas:
        view = client.get(f"/jobs/{job.id}").json()
        assert view["lines_received"] == lines
        assert view["diagnosis"]["compression"]["lines_in"] == lines
        assert view["diagnosis"]["progress"]["last_step"] == 300
    assert replicas[1].post(f"/jobs/{job.id}/finish", json={"exit_code": 0}).json()["status"] == "healthy"
