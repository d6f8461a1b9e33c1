"""Issue 5's acceptance test: a writer appends lines to eight rank files with two rotations,
while the server is killed (SIGKILL) and restarted and the sidecar is killed (SIGKILL) and
restarted; the server ends with every line exactly once, by count and by CRC-32 of every
physical file. The real `faultline serve` and `faultline tail` run as child processes.

The suite uses FAULTLINE_ACCEPTANCE_LINES lines (default 200,000, to stay well under two
minutes on a shared machine); bench/sidecar_bench.py runs the full 1,000,000.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support.rank_writer import RankFiles
from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
LINES = int(os.environ.get("FAULTLINE_ACCEPTANCE_LINES", "200000"))
JOB = "gpt-7b-pretrain-20250331"


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    env.update(PYTHONPATH=str(ROOT), FAULTLINE_DATA_DIR=str(tmp_path / "server-data"),
               FAULTLINE_ADMIN_ENABLED="false")
    return env


class SidecarProcess:
    def __init__(self, url: str, logs: Path, state: Path, env: dict[str, str]):
        self.argv = [sys.executable, "-m", "service.cli", "tail", "--server", url, "--job-name", JOB,
                     "--state-dir", str(state), "--glob-interval", "0.2", "--poll-interval", "0.05",
                     "--rotate-wait", "1", "--retry-max", "0.5", "--batch-bytes", "512K", "--quiet",
                     str(logs / "rank*.log")]
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.log = state.parent / "sidecar.stderr"

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.mark.slow
def test_every_line_arrives_exactly_once_through_kills_restarts_and_rotations(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    files = RankFiles(logs, ranks=8)
    server = ServerProcess(env, cwd=str(ROOT))
    sidecar = SidecarProcess(server.url, logs, tmp_path / "sidecar-state", {**env, "FAULTLINE_DATA_DIR": str(tmp_path)})
    client = httpx.Client(timeout=10)
    job: dict[str, str] = {}

    def received() -> int:
        try:
            found = client.get(f"{server.url}/jobs", params={"name": JOB}).json()["data"]
        except httpx.TransportError:
            return -1
        if found:
            job["id"] = found[0]["id"]
            return found[0]["lines_received"]
        return 0

    server.start()
    try:
        fifth = LINES // 5
        files.write_lines(fifth)
        sidecar.start()
        wait_until("the first lines", lambda: received() > 0)
        files.write_lines(fifth)
        wait_until("lines flowing", lambda: received() > fifth // 2)
        sidecar.kill()  # mid-stream: batches sent, maybe acknowledged, not all checkpointed
        files.write_lines(fifth // 2)
        files.rotate()  # rotation 1 while the sidecar is down
        files.write_lines(fifth // 2)
        sidecar.start()
        wait_until("the restarted sidecar to catch up a little", lambda: received() > 2 * fifth)
        files.write_lines(fifth // 2)
        server.kill()  # mid-stream again: requests in flight die with it
        files.write_lines(fifth // 2)
        files.rotate()  # rotation 2 while the server is down
        files.write_lines(fifth // 2)
        server.start()
        files.write_lines(LINES - files.lines_written)
        files.close()
        wait_until(f"all {files.lines_written} lines", lambda: received() >= files.lines_written, timeout_s=180)
        assert received() == files.lines_written, "no line counted twice"
        sources = client.get(f"{server.url}/jobs/{job['id']}/sources").json()["data"]
        got = sorted((s["bytes"], s["lines"], s["crc32"]) for s in sources)
        assert got == files.manifest(), "every physical file arrived whole, byte for byte"
        assert files.rotations == 2 and len(sources) == 3 * files.ranks
        assert {s["source"] for s in sources} == {str(files.path(r)) for r in range(files.ranks)}
        assert sidecar.stop() == 0
        assert server.starts == 2
    finally:
        client.close()
        if sidecar.proc is not None and sidecar.proc.poll() is None:
            sidecar.kill()
        server.kill()
