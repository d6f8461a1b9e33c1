"""A real uvicorn server on a free loopback port, in a thread or as a child process, for
end-to-end tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from service.app import create_app
from service.settings import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(settings: Settings, *, startup_timeout_s: float = 60.0, embedder: object | None = None) -> Iterator[str]:
    """Yields the base URL once /healthz answers; stops the server on exit. `embedder`: a
    loaded embedding model to share (the session's), else the app loads its own if needed."""
    if "preload_failure_agent" not in settings.model_fields_set:
        # the tests that need the agent build it on first use; a build per server at start
        # would only load the CPU (tests/service/test_failure_agent_preload.py covers it)
        settings = settings.model_copy(update={"preload_failure_agent": False})
    port = free_port()
    config = uvicorn.Config(create_app(settings, embedder=embedder), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class ServerProcess:
    """`faultline serve` as a child process on a fixed loopback port, so a test can kill it
    (SIGKILL: no shutdown, like a crashed replica) and start it again on the same database."""

    def __init__(self, env: dict[str, str], *, port: int | None = None, cwd: str | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"FAULTLINE_PRELOAD_FAILURE_AGENT": "false", **env}  # as running_server
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, *, timeout_s: float = 90.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env, cwd=self.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("the server did not start")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.kill()


def health_when(url: str, wanted: Callable[[httpx.Response], bool], *, timeout_s: float = 30.0) -> httpx.Response:
    """/healthz once it says what `wanted` checks: it answers from a probe that runs every
    second (service/api/health.py), so a change shows within a second or two."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = httpx.get(f"{url}/healthz", timeout=5)
            if wanted(r) or time.monotonic() > deadline:
                return r
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)
