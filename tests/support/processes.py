"""`faultline serve` as real processes on loopback (replicas), for multi-process tests and
the load benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Replica:
    url: str
    pid: int
    """The `faultline serve` process (with --workers N, the parent of the workers)."""


@contextmanager
def serve_process(env: Mapping[str, str], *, workers: int = 1, startup_timeout_s: float = 120.0,
                  log_path: Path | None = None) -> Iterator[Replica]:
    """Starts `faultline serve` with `env` (FAULTLINE_* settings) and yields it once /healthz
    answers; terminates the process (and its workers) on exit."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    environ.update({"FAULTLINE_PRELOAD_FAILURE_AGENT": "false"}, **env)  # as running_server
    environ.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers)], env=environ, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"faultline serve exited with {process.returncode}"
                                   + (f" (see {log_path})" if log_path else ""))
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("faultline serve did not start in time")
            time.sleep(0.1)
        yield Replica(url, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log_path:
            out.close()
