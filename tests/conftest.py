"""Shared fixtures: isolated settings per test, the scripted LLM, a guard against real endpoints."""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from tests.support.llm_server import ScriptedLLM

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path, monkeypatch) -> Iterator[None]:
    """Every test gets its own data dir; no FAULTLINE_* setting leaks in from the shell,
    and no test may talk to an LLM that is not on loopback."""
    for key in list(os.environ):
        if key.startswith("FAULTLINE_") and key != "FAULTLINE_TEST_DATABASE_URL":
            monkeypatch.delenv(key)
    monkeypatch.setenv("FAULTLINE_DATA_DIR", str(tmp_path / "faultline-data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    yield
    url = os.environ.get("FAULTLINE_LLM_BASE_URL", "")
    if url and urlparse(url).hostname not in LOOPBACK:
        pytest.fail(f"test used a non-loopback LLM endpoint {url!r}")


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture(scope="session")
def minilm():
    """The real embedding model (all-MiniLM-L6-v2 from its package folder), loaded once for
    the whole run: inference is stateless, so sharing it changes no test's outcome, and each
    load costs seconds. Its vector cache only skips recomputing the same text."""
    from agents.vector_store import load_minilm

    return load_minilm()
