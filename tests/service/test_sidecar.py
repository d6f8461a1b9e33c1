"""`faultline tail` as a real child process against a real server: running the training
command (tee, diagnosis before the end, exit status reported), reading from the end, new
files found by the globs, the server down at the start (retries, a bounded buffer, nothing
lost), the epilog's `--once` on another machine (the server says where to resume); and the
reader's buffer bound in-process. Waits poll observable state with deadlines."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from service.cli import main, split_command
from service.settings import Settings
from service.sidecar.sender import Checkpoint, Latencies, Sender, Shared
from service.sidecar.run import Sidecar, SidecarConfig, default_state_dir
from service.sidecar.tailer import Batch, TailConfig
from tests.service.test_live_api import ECC, iteration, text
from tests.support.server import ServerProcess, free_port, running_server
from tests.support.torchrun import EXCEPTION, failing_torchrun, without_the_box

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--glob-interval", "0.2", "--poll-interval", "0.05", "--retry-max", "0.5", "--flush-interval", "0.1"]

TRAIN = textwrap.dedent('''
    import os, sys, time
    print("> compiling and loading fused kernels ...", flush=True)
    for step in range(1, 61):
        print({iteration!r}.format(step=step), flush=True)
    print({ecc!r}, flush=True)
    print("[lrdn3321:3]:terminate called after throwing an instance of 'c10::DistBackendError'", flush=True)
    while not os.path.exists(sys.argv[1]):  # the test looks at the job before it ends
        time.sleep(0.05)
    sys.exit(1)
''')


def wait_until(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def env_for(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    return {**env, "PYTHONPATH": str(ROOT), "FAULTLINE_DATA_DIR": str(tmp_path / "sidecar-data")}


def tail(url: str, job: str, *args: str, env: dict[str, str], **kwargs: object) -> subprocess.Popen:
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.Popen([sys.executable, "-m", "service.cli", "tail", "--server", url, "--job-name", job,
                             *FAST, *args], env=env, cwd=ROOT, **streams)


def job_named(url: str, name: str) -> dict | None:
    found = httpx.get(f"{url}/jobs", params={"name": name}, timeout=10).json()["data"]
    return found[0] if found else None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    settings = Settings(data_dir=tmp_path_factory.mktemp("sidecar-server"), admin_enabled=False)
    with running_server(settings) as url:
        yield url


def test_it_runs_the_command_tees_its_output_and_reports_the_exit_status(server: str, tmp_path: Path) -> None:
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(TRAIN.format(iteration=iteration(10**6, 2.3).replace(f"{10**6:8d}", "{step:8d}"), ecc=ECC))
    marker, tee = tmp_path / "go", tmp_path / "logs" / "launcher.log"
    proc = tail(server, "gpt-cmd-20250331", "--tee", str(tee), "--", sys.executable, str(script), str(marker),
                env=env_for(tmp_path))
    try:
        job = wait_until("the diagnosis while the command runs",
                         lambda: (j := job_named(server, "gpt-cmd-20250331")) and j["status"] == "failed" and j)
        assert job["finished_at"] is None and proc.poll() is None, "diagnosed before it ended"
        assert job["diagnosis"]["root_cause"]["reason"] == "ecc_error" and job["diagnosis"]["root_cause"]["line"] == ECC
        marker.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 1, err.decode()
    final = httpx.get(f"{server}/jobs/{job['id']}").json()
    assert final["finished_at"] and final["exit_code"] == 1 and final["status"] == "failed"
    assert final["lines_received"] == 63
    assert ECC.encode() in out, "the command's output is echoed"
    assert tee.read_bytes().count(b"\n") == 63
    summary = re.search(r"delivered (\d+) lines in (\d+) batches; acknowledgement p50 [\d.]+ s, p99 [\d.]+ s, "
                        r"max [\d.]+ s; read to acknowledgement p50 [\d.]+ s, p99 [\d.]+ s, max [\d.]+ s; "
                        r"(\d+) retries", err.decode())
    assert summary, err.decode()
    assert int(summary.group(1)) == 63 and int(summary.group(2)) >= 1 and summary.group(3) == "0"


def test_delivery_times_are_a_bounded_uniform_sample() -> None:
    times = Latencies(keep=100)
    for i in range(10_000):
        times.add(i / 1000)
    assert len(times.samples) == 100 and times.count == 10_000 and times.largest == 9.999
    # a uniform sample of 0..10 s: its median is near 5 s, not stuck on the first 100 values
    assert 3.5 < times.percentile(0.5) < 6.5 and times.percentile(0.99) > 8.5
    assert Latencies().describe() == "none" and Latencies().percentile(0.5) is None


def test_from_end_skips_old_lines_and_new_files_are_found(server: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_bytes(text([iteration(s, 2.3, rank=0) for s in range(1, 1001)]))
    errors = tmp_path / "sidecar.err"
    with open(errors, "wb") as err:
        proc = tail(server, "gpt-from-end", "--from", "end", str(logs / "rank*.log"), env=env_for(tmp_path),
                    stderr=err)
    try:
        wait_until("it to take its place at the end", lambda: b"rank0.log from byte" in errors.read_bytes())
        with open(logs / "rank0.log", "ab") as handle:
            handle.write(text([iteration(s, 2.3, rank=0) for s in range(1001, 1011)]))
        (logs / "rank1.log").write_bytes(text([iteration(s, 2.3, rank=1) for s in range(1, 6)]))
        job = wait_until("15 new lines",
                         lambda: (j := job_named(server, "gpt-from-end")) and j["lines_received"] >= 15 and j)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert job["lines_received"] == 15
    sources = {s["source"].rsplit("/", 1)[-1]: s for s in httpx.get(f"{server}/jobs/{job['id']}/sources").json()["data"]}
    assert sources["rank0.log"]["first_offset"] == (logs / "rank0.log").stat().st_size - sources["rank0.log"]["bytes"]
    assert sources["rank1.log"]["first_offset"] == 0


def test_the_server_down_at_start_loses_nothing(tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "FAULTLINE_ADMIN_ENABLED": "false"}
    server = ServerProcess({**env, "FAULTLINE_DATA_DIR": str(tmp_path / "server-data")}, cwd=str(ROOT))
    logs = tmp_path / "logs"
    logs.mkdir()
    expected = b"".join(text([iteration(s, 2.3, rank=r) for s in range(1, 3001)]) for r in range(2))
    (logs / "rank0.log").write_bytes(expected[:len(expected) // 2])
    (logs / "rank1.log").write_bytes(expected[len(expected) // 2:])
    errors = tmp_path / "sidecar.err"
    with open(errors, "wb") as err:
        proc = tail(server.url, "gpt-late-server", "--batch-bytes", "16K", "--buffer-bytes", "64K",
                    str(logs / "rank*.log"), env=env, stderr=err)
    try:
        # it retries against nothing, its buffer holding 64K of the 1.9 MB, until the server is up
        wait_until("retries", lambda: errors.read_bytes().count(b"retrying") >= 3)
        assert proc.poll() is None
        server.start()
        job = wait_until("all lines", lambda: (j := job_named(server.url, "gpt-late-server"))
                         and j["lines_received"] >= 6000 and j, timeout_s=120)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        server.kill()
    assert job["lines_received"] == 6000


def test_the_epilog_sends_the_rest_and_the_exit_status_without_a_checkpoint(server: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "rank0.log"
    log.write_bytes(text([iteration(s, 2.3) for s in range(1, 501)]))
    args = ["--job-key", "slurm-777001", str(logs / "rank*.log")]
    node = tail(server, "gpt-epilog", *args, env=env_for(tmp_path / "node"))
    try:
        wait_until("the first 500 lines", lambda: (j := job_named(server, "gpt-epilog")) and j["lines_received"] == 500)
    finally:
        node.send_signal(signal.SIGKILL)
        node.communicate(timeout=30)
    with open(log, "ab") as handle:  # the job's last words, after the node's sidecar died
        handle.write(text([iteration(s, 2.3) for s in range(501, 521)] + [ECC]) + b"partial last li")
    epilog = tail(server, "gpt-epilog", "--once", "--exit-code", "1", *args, env=env_for(tmp_path / "controller"))
    _, err = epilog.communicate(timeout=90)
    assert epilog.returncode == 1, err.decode()
    job = job_named(server, "gpt-epilog")
    assert job["lines_received"] == 522, "the rest exactly once, the partial last line included"
    assert job["finished_at"] and job["exit_code"] == 1
    assert job["diagnosis"]["root_cause"]["line"] == ECC
    # a second epilog (or one after a sidecar that reported the end itself) finds no open job
    again = tail(server, "gpt-epilog", "--once", "--exit-code", "1", *args, env=env_for(tmp_path / "other"))
    _, err = again.communicate(timeout=90)
    assert b"already reported" in err
    assert len(httpx.get(f"{server}/jobs", params={"name": "gpt-epilog"}).json()["data"]) == 1, "no new job"


def test_the_sidecar_sends_torchruns_error_files_when_the_job_ends(server: str, tmp_path: Path) -> None:
    """A real torchrun's failed worker: the log the sidecar follows lost the box; the error
    file torchrun kept is sent at the end (a glob, as `faultline diagnose --error-file` takes)
    and the final diagnosis names its exception."""
    console, elastic = failing_torchrun(tmp_path)
    log = tmp_path / "logs" / "launcher.log"
    log.parent.mkdir()
    log.write_text(without_the_box(console))
    epilog = tail(server, "gpt-error-file", "--once", "--exit-code", "1", "--error-files",
                  str(elastic / "**" / "error.json"), "--error-files", str(tmp_path / "none" / "*.json"),
                  str(log), env=env_for(tmp_path))
    _, err = epilog.communicate(timeout=90)
    assert epilog.returncode == 1, err.decode()
    job = job_named(server, "gpt-error-file")
    root = job["diagnosis"]["root_cause"]
    assert job["finished_at"] and root["reason"] == "value_error" and root["line"] == f"[default1]:{EXCEPTION}"
    assert root["file"].endswith("attempt_0/1/error.json")


def test_the_reader_stops_at_the_buffer_bound(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_bytes(text([iteration(s, 2.3) for s in range(1, 20001)]))
    config = SidecarConfig(server="http://127.0.0.1:9", job_name="gpt", paths=(str(tmp_path / "*.log"),),
                           state_dir=tmp_path / "state", tail=TailConfig(batch_bytes=32 << 10),
                           buffer_bytes=256 << 10)
    sidecar = Sidecar(config)  # the sender is not started: nothing is ever acknowledged
    try:
        for _ in range(50):
            sidecar._step()
        held = sidecar.shared.queued_bytes + sidecar.tailer.open_bytes()
        assert 200 << 10 < held <= 256 << 10
        assert next(iter(sidecar.tailer.files.values())).read_pos <= 256 << 10
    finally:
        sidecar.tailer.close()
        sidecar.checkpoint.close()


def test_two_sidecars_never_share_a_checkpoint(tmp_path: Path) -> None:
    first = Checkpoint(tmp_path / "state")
    with pytest.raises(RuntimeError, match="another sidecar"):
        Checkpoint(tmp_path / "state")
    first.close()
    assert default_state_dir(tmp_path, "http://a", "gpt/7b run", ("x",)).name.startswith("gpt-7b-run-")
    assert default_state_dir(tmp_path, "http://a", "j", ("x",)) != default_state_dir(tmp_path, "http://a", "j", ("y",))


@pytest.mark.parametrize(("argv", "message"), [
    (["tail", "--server", "http://127.0.0.1:9", "--job-name", "gpt"], "PATH"),
    (["tail", "--job-name", "gpt", "a.log"], "FAULTLINE_SERVER_URL"),
    (["tail", "--server", "ftp://x", "--job-name", "gpt", "a.log"], "http(s) URL"),
    (["tail", "--server", "http://127.0.0.1:9", "--job-name", "gpt", "--exit-code", "1", "a.log"], "--once"),
    (["tail", "--server", "http://127.0.0.1:9", "--job-name", "gpt", "--once", "a.log", "--", "true"], "--once"),
])
def test_bad_sidecar_usage_exits_2_with_one_line(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_command_after_double_dash_is_the_sidecars_own() -> None:
    assert split_command(["tail", "--server", "u", "x.log", "--", "torchrun", "--nproc-per-node", "8", "--",
                          "a"]) == (["tail", "--server", "u", "x.log"], ["torchrun", "--nproc-per-node", "8", "--", "a"])
    assert split_command(["diagnose", "--", "x"]) == (["diagnose", "--", "x"], [])
    assert free_port() > 0


def test_open_batches_of_many_files_never_block_the_buffer(tmp_path: Path) -> None:
    for rank in range(8):
        (tmp_path / f"rank{rank}.log").write_bytes(text([iteration(s, 2.3, rank=rank) for s in range(1, 1001)]))
    expected = sum(p.stat().st_size for p in tmp_path.glob("*.log"))
    config = SidecarConfig(server="http://127.0.0.1:9", job_name="gpt", paths=(str(tmp_path / "*.log"),),
                           state_dir=tmp_path / "state", tail=TailConfig(batch_bytes=128 << 10),
                           buffer_bytes=256 << 10)
    sidecar = Sidecar(config)  # eight open batches could hold 1 MB: more than the whole buffer
    delivered = 0
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            sidecar._step()
            time.sleep(0.002)
            with sidecar.shared.cond:  # what the sender does when the server acknowledges
                delivered += sum(len(b.body) for b in sidecar.shared.queue)
                sidecar.shared.queue.clear()
                sidecar.shared.queued_bytes = 0
            if delivered == expected:
                break
    finally:
        sidecar.tailer.close()
        sidecar.checkpoint.close()
    assert delivered == expected


def test_a_sender_that_fell_behind_joins_the_batches_of_a_file(tmp_path: Path) -> None:
    """Each request has a fixed cost on the server: queued batches that continue one file go
    in one request, up to the batch size, never past a partial line or across a resync."""

    def batch(file: str, offset: int, body: bytes, *, read_at: float = 1.0, epoch: int = 0) -> Batch:
        return Batch(f"logs/{file}.log", file, offset, offset + len(body), body, read_at, epoch, False)

    config = SidecarConfig(server="http://127.0.0.1:9", job_name="gpt-7b", paths=("logs/*.log",),
                           state_dir=tmp_path, tail=TailConfig(batch_bytes=1024))
    shared, checkpoint = Shared(), Checkpoint(tmp_path / "state")
    sender = Sender(config, shared, checkpoint, threading.Event())
    a1, b1, a2 = batch("a", 0, b"one\ntwo\n"), batch("b", 0, b"x\n"), batch("a", 8, b"three\n", read_at=2.0)
    a3, a4 = batch("a", 14, b"fou", read_at=3.0), batch("a", 17, b"r\n")  # a partial line sent on its timeout
    shared.queue.extend([a1, b1, a2, a3, a4])
    with shared.cond:
        joined = sender.coalesce()
    assert (joined.source, joined.file_id, joined.offset, joined.end) == ("logs/a.log", "a", 0, 17)
    assert joined.body == b"one\ntwo\nthree\nfou" and joined.read_at == 3.0, "dated by its newest bytes"
    assert list(shared.queue) == [joined, b1, a4]

    big = [batch("c", i * 600, b"x" * 599 + b"\n") for i in range(2)]
    resynced = [batch("d", 0, b"y\n"), batch("d", 2, b"z\n", epoch=1)]
    gap = [batch("e", 0, b"y\n"), batch("e", 5, b"z\n")]
    for parts in (big, resynced, gap):
        shared.queue.clear()
        shared.queue.extend(parts)
        with shared.cond:
            assert sender.coalesce() is parts[0] and list(shared.queue) == parts
    sender.client.close()
    checkpoint.close()


def test_an_over_long_line_keeps_its_head_and_the_file_arrives_whole(server: str, tmp_path: Path) -> None:
    """The rest of a line past --max-line-bytes is skipped, not sent: the sidecar says so
    (cut=1), the server takes the range, and the next lines follow at the right offset."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "rank0.log"
    long_line = b"tokens: " + b"x" * 3_000_000 + b"\n"  # longer than one read: it is cut while read
    log.write_bytes(text([iteration(s, 2.3) for s in range(1, 11)]) + long_line
                    + text([iteration(s, 2.3) for s in range(11, 21)] + [ECC]))
    node = tail(server, "gpt-long-line", "--once", "--exit-code", "1", "--max-line-bytes", "1024",
                str(logs / "rank*.log"), env=env_for(tmp_path / "node"))
    _, err = node.communicate(timeout=90)
    assert node.returncode == 1, err.decode()
    job = job_named(server, "gpt-long-line")
    assert job["lines_received"] == 22 and job["diagnosis"]["root_cause"]["line"] == ECC
    (source,) = httpx.get(f"{server}/jobs/{job['id']}/sources", timeout=10).json()["data"]
    assert source["next_offset"] == log.stat().st_size  # every byte of the file accounted for
