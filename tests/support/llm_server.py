"""A loopback OpenAI-compatible server with scripted replies, for tests of the real client path.

Like the Agents SDK's ScriptedModel: a queue of replies, every request recorded, an
unexpected call is an error (HTTP 500 and recorded), and `assert_complete()` fails when
scripted replies were left unused. Agents talk to it through the real `openai` package.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0


class UnexpectedModelCall(AssertionError):
    pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (a timeout test) is expected; anything else is printed."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class ScriptedLLM:
    def __init__(self, replies: list[Reply | str] | None = None, *, model: str = "scripted-model"):
        self.model = model
        self._replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.unexpected: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        for reply in replies or []:
            self.add(reply)
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, reply: Reply | str) -> None:
        with self._lock:
            self._replies.append(Reply(reply) if isinstance(reply, str) else reply)

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def assert_complete(self) -> None:
        if self.unexpected:
            raise UnexpectedModelCall(f"{len(self.unexpected)} call(s) arrived with no reply scripted")
        if self._replies:
            raise AssertionError(f"{len(self._replies)} scripted repl(ies) were never requested")

    def _next(self, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            self.requests.append(body)
            if not self._replies:
                self.unexpected.append(body)
                return None
            return self._replies.popleft()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": scripted.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                reply = scripted._next(body)
                if reply is None:
                    self._send(500, {"error": {"message": "unexpected call: no reply scripted"}})
                    return
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    self._send(reply.status, {"error": {"message": f"scripted status {reply.status}"}})
                    return
                self._send(200, {
                    "id": f"chatcmpl-{len(scripted.requests)}", "object": "chat.completion",
                    "created": int(time.time()), "model": body.get("model", scripted.model),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply.content}}],
                    "usage": {"prompt_tokens": sum(len(m.get("content", "")) // 4 for m in body.get("messages", [])),
                              "completion_tokens": len(reply.content) // 4, "total_tokens": 0},
                })

        return Handler
