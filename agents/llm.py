"""The LLM backend: one small interface, one implementation over the `openai` package.

Any OpenAI-compatible endpoint works (vLLM, Ollama, llama.cpp server, OpenAI). Agents never
see the client; they call `complete()` and parse the reply into a pydantic model with
`parse_reply()`. A reply that does not parse is the model's fault (ModelBehaviorError); an
endpoint that does not answer is the endpoint's (LLMUnavailable); agents treat both as a
failed vote or fall back to their embedded decision, never as a failed diagnosis.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    import openai

T = TypeVar("T", bound=BaseModel)
CHARS_PER_TOKEN = 4
"""Rough size of a token in log text, for budgets (a tokenizer per model is not worth it)."""


class ModelBehaviorError(Exception):
    """The model answered, but not with what was asked (malformed JSON, wrong fields)."""


class LLMUnavailable(Exception):
    """The endpoint did not answer usefully after retries (timeouts, 5xx, refused)."""


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class LLMBackend(Protocol):
    name: str
    """`openai:<model>`: recorded as the provenance of what the model proposes."""

    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0,
                 max_tokens: int = 512) -> str:
        """One reply's text."""

    def close(self) -> None: ...


class OpenAIBackend:
    """Chat completions through the real `openai` client, with retries and backoff."""

    def __init__(self, client: openai.OpenAI, model: str, *, max_retries: int = 2, backoff_s: float = 0.5):
        self.client = client
        self.model = model
        self.name = f"openai:{model}"
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0, max_tokens: int = 512) -> str:
        import openai  # imported here: 0.8 s that commands without an LLM should not pay

        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

        payload = [{"role": m.role, "content": m.content} for m in messages]
        # a lost connection, a timeout, 429 and 5xx may pass: retried with exponential backoff;
        # any other 4xx will not, and is not retried
        passing = (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError, openai.InternalServerError)
        retrying = Retrying(retry=retry_if_exception_type(passing), stop=stop_after_attempt(self.max_retries + 1),
                            wait=wait_exponential(multiplier=self.backoff_s, min=self.backoff_s), sleep=time.sleep)
        try:
            response = retrying(self.client.chat.completions.create, model=self.model, messages=payload,
                                temperature=temperature, max_tokens=max_tokens)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise LLMUnavailable(f"{self.name}: no answer after {self.max_retries + 1} attempts "
                                 f"({type(last).__name__})") from None
        except openai.APIStatusError as exc:  # 4xx other than 429: retrying will not help
            raise LLMUnavailable(f"{self.name}: HTTP {exc.status_code}") from None
        self._count(response)
        content = response.choices[0].message.content if response.choices else None
        if not content:
            raise ModelBehaviorError(f"{self.name}: empty reply")
        return content

    def _count(self, response: object) -> None:
        self.calls += 1
        usage = getattr(response, "usage", None)
        if usage is not None:
            self.prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
            self.completion_tokens += getattr(usage, "completion_tokens", 0) or 0

    def usage(self) -> Usage:
        return Usage(self.calls, self.prompt_tokens, self.completion_tokens)

    def close(self) -> None:
        self.client.close()


def make_backend(base_url: str, model: str, api_key: str = "", *, timeout_s: float = 30.0,
                 max_retries: int = 2) -> OpenAIBackend:
    import openai

    # the client's own retries are off: ours count attempts and back off the same way for every error
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=0)
    return OpenAIBackend(client, model, max_retries=max_retries)


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _json_candidates(text: str) -> list[str]:
    """The reply itself, fenced blocks, and the outermost {...} or [...] span."""
    out = [text.strip()]
    out += [m.group(1).strip() for m in _FENCE.finditer(text)]
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            out.append(text[start:end + 1])
    return out


def parse_reply(text: str, model: type[T]) -> T:
    """Parse a model's reply into `model`; raise ModelBehaviorError without echoing the reply."""
    problem = "no JSON object found"
    for candidate in _json_candidates(text):
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            problem = f"{exc.error_count()} validation error(s): " + "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['type']}" for e in exc.errors()[:5])
    # raised outside any except block, so the reply does not ride along as __context__
    raise ModelBehaviorError(f"reply does not fit {model.__name__}: {problem}")


def _list_start(text: str, key: str) -> int:
    match = re.search(r'"%s"\s*:\s*\[' % re.escape(key), text)
    return match.end() if match else -1


def salvage_items(text: str, key: str, model: type[T], *, limit: int = 50) -> list[T]:
    """The complete leading items of the JSON list under `key` in a reply that does not parse
    as a whole: one cut off at max_tokens, or one that goes wrong further on (small models
    pretty-print, repeat an item until the budget runs out, or trail off into prose).
    Items are read one by one in order; the first that is not a complete, valid item ends the
    list, so nothing after a broken part is guessed at."""
    pos = _list_start(text, key)
    if pos < 0:
        return []
    decoder = json.JSONDecoder()
    items: list[T] = []
    while len(items) < limit:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            data, pos = decoder.raw_decode(text, pos)
            items.append(model.model_validate(data))
        except (json.JSONDecodeError, ValidationError):
            break
    return items


def truncate_to_budget(lines: Sequence[str], max_tokens: int) -> list[str]:
    """As many whole lines as fit the token budget (head first)."""
    budget = max_tokens * CHARS_PER_TOKEN
    out: list[str] = []
    for line in lines:
        budget -= len(line) + 1
        if budget < 0:
            break
        out.append(line)
    return out
