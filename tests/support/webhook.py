"""A webhook receiver on loopback: records every delivery (headers and raw body) and answers
with scripted status codes (then 200), so retries and signatures can be checked for real."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Delivery:
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class WebhookReceiver:
    def __init__(self, statuses: list[int] | None = None):
        self.statuses = list(statuses or [])
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.deliveries.append(Delivery(dict(self.headers.items()), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def accepted(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.status == 200]

    def wait_for(self, check: Callable[[list[Delivery]], bool], timeout_s: float = 30.0) -> list[Delivery]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                seen = list(self.deliveries)
            if check(seen):
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(f"webhook deliveries never matched: {[d.json.get('event') for d in seen]}")
            time.sleep(0.05)
