"""A real uvicorn server on a free loopback port, in a thread, for end-to-end tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
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
