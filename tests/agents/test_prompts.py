"""Every prompt file renders with its placeholders, and a missing one is an error."""

from __future__ import annotations

import pytest

import prompts


@pytest.mark.parametrize("name", prompts.names())
def test_every_prompt_renders(name) -> None:
    values = {key: f"<{key}>" for key in prompts.placeholders(name)}
    text = prompts.render(name, **values)
    assert all(f"<{key}>" in text for key in values)


def test_a_missing_value_is_an_error() -> None:
    with pytest.raises(prompts.PromptError, match="nonce"):
        prompts.render("failure_agent_decide", framework="x", rules_summary="y", reasons="z", candidates="c",
                       context="d")
