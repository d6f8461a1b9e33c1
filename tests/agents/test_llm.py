"""The LLM backend over the real `openai` client, against the scripted loopback server."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agents.llm import (
    LLMUnavailable,
    Message,
    ModelBehaviorError,
    make_backend,
    parse_reply,
    salvage_items,
    truncate_to_budget,
)
from tests.support.llm_server import Reply


class Verdict(BaseModel):
    reason: str
    confidence: float


def test_reply_goes_through_the_openai_client(scripted_llm) -> None:
    scripted_llm.add('Sure! ```json\n{"reason": "ecc_error", "confidence": 0.9}\n```')
    backend = make_backend(scripted_llm.url, "m1", timeout_s=5)
    text = backend.complete([Message("system", "be terse"), Message("user", "log here")], temperature=0.7)
    assert parse_reply(text, Verdict) == Verdict(reason="ecc_error", confidence=0.9)
    sent = scripted_llm.requests[0]
    assert sent["model"] == "m1" and sent["temperature"] == 0.7
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]
    assert backend.usage().calls == 1
    scripted_llm.assert_complete()


def test_server_errors_are_retried_then_reported(scripted_llm) -> None:
    scripted_llm.add(Reply(status=503))
    scripted_llm.add(Reply(status=500))
    scripted_llm.add('{"reason": "hang", "confidence": 0.5}')
    backend = make_backend(scripted_llm.url, "m1", timeout_s=5, max_retries=2)
    backend.backoff_s = 0.01
    assert "hang" in backend.complete([Message("user", "x")])
    scripted_llm.add(Reply(status=500))
    scripted_llm.add(Reply(status=500))
    scripted_llm.add(Reply(status=500))
    with pytest.raises(LLMUnavailable, match="3 attempts"):
        backend.complete([Message("user", "x")])
    scripted_llm.assert_complete()


def test_a_timeout_is_an_unavailable_endpoint(scripted_llm) -> None:
    scripted_llm.add(Reply("{}", delay_s=2.0))
    backend = make_backend(scripted_llm.url, "m1", timeout_s=0.3, max_retries=0)
    with pytest.raises(LLMUnavailable):
        backend.complete([Message("user", "x")])


def test_client_errors_are_not_retried(scripted_llm) -> None:
    scripted_llm.add(Reply(status=400))
    backend = make_backend(scripted_llm.url, "m1", timeout_s=5)
    with pytest.raises(LLMUnavailable, match="HTTP 400"):
        backend.complete([Message("user", "x")])
    scripted_llm.assert_complete()


@pytest.mark.parametrize("reply", ["not json at all", '{"reason": 3}', "[1, 2]", '{"confidence": "high"}'])
def test_malformed_replies_are_model_errors_that_do_not_echo_the_reply(reply: str) -> None:
    with pytest.raises(ModelBehaviorError) as info:
        parse_reply(reply, Verdict)
    assert reply not in str(info.value)
    assert info.value.__context__ is None


def test_budget_keeps_whole_lines() -> None:
    assert truncate_to_budget(["a" * 7, "b" * 7, "c" * 7], max_tokens=4) == ["a" * 7, "b" * 7]


class Item(BaseModel):
    pattern: str


@pytest.mark.parametrize(("reply", "kept"), [
    pytest.param('{"rules": [{"pattern": "a"}, {"pattern": "b"}, {"pat', ["a", "b"], id="cut-off-at-max-tokens"),
    pytest.param('Here:\n```json\n{\n  "rules": [\n    {"pattern": "a"},\n    {"pattern": "a"},\n    {"pattern": "a"},\n'
                 '    {"pattern"', ["a", "a", "a"], id="pretty-printed-repeating"),
    pytest.param('{"rules": [{"pattern": "a"}, {"pattern": 3}, {"pattern": "c"}]', ["a"],
                 id="stops-at-an-invalid-item"),
    pytest.param('{"rules": [{"pattern": "a"} oops {"pattern": "b"}]}', ["a"], id="stops-at-garbage"),
    pytest.param('{"rules": [{"pattern": "a\\[', [], id="first-item-incomplete"),
    pytest.param('{"error_lines": [1, 2]', [], id="no-list-under-the-key"),
    pytest.param("I cannot help with that.", [], id="prose"),
])
def test_salvage_keeps_only_complete_leading_items(reply: str, kept: list[str]) -> None:
    assert [item.pattern for item in salvage_items(reply, "rules", Item)] == kept


def test_salvage_is_bounded() -> None:
    reply = '{"rules": [' + '{"pattern": "a"}, ' * 500
    assert len(salvage_items(reply, "rules", Item, limit=50)) == 50
