"""Shared fixtures: isolated settings per test, the scripted LLM, a guard against real endpoints,
and the database every test runs on (SQLite files, or PostgreSQL: tests/support/databases.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from urllib.parse import urlparse

import pytest

from tests.support import databases
from tests.support.llm_server import ScriptedLLM

LOOPBACK = {"127.0.0.1", "localhost", "::1"}

_fixtures_being_set_up: list[pytest.FixtureRequest] = []
_test_drops: list[Callable[[], None]] = []
_postgres: databases.PostgresDatabases | None = None
_postgres_problem: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _postgres, _postgres_problem
    url = databases.server_url()
    if url:
        _postgres = databases.PostgresDatabases(url)
        _postgres_problem = _postgres.check()


def pytest_report_header(config: pytest.Config) -> str:
    if _postgres is None:
        return "database: SQLite (set FAULTLINE_TEST_DATABASE_URL for the PostgreSQL run)"
    where = databases.shown_url()
    return f"database: PostgreSQL at {where}" + (f" -- NOT REACHABLE: {_postgres_problem}" if _postgres_problem else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _postgres is not None and _postgres_problem:
        skip = pytest.mark.skip(reason=f"PostgreSQL run skipped: no server at {databases.shown_url()} "
                                       f"({_postgres_problem})")
        for item in items:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A database made while a fixture is set up belongs to that fixture (module-scoped
    servers keep theirs for the whole module); one made in a test body, to the test."""
    _fixtures_being_set_up.append(request)
    try:
        yield
    finally:
        _fixtures_being_set_up.pop()


def _register_drop(drop: Callable[[], None]) -> None:
    if _fixtures_being_set_up:
        _fixtures_being_set_up[-1].addfinalizer(drop)
    else:
        _test_drops.append(drop)


@pytest.fixture(scope="session", autouse=True)
def _database_per_data_dir() -> Iterator[None]:
    """On PostgreSQL, the service's default database (a SQLite file in the data dir) becomes a
    fresh PostgreSQL database per data dir: every Settings(data_dir=...) a test makes."""
    if _postgres is None or _postgres_problem:
        yield
        return
    databases.activate(_postgres, _register_drop)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("service.settings.default_database_url", databases.database_url)
        yield
    databases.activate(None, None)


@pytest.fixture(autouse=True)
def _drop_test_databases() -> Iterator[None]:
    """Torn down last among a test's fixtures: its servers have stopped by then."""
    yield
    while _test_drops:
        _test_drops.pop()()


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path, monkeypatch) -> Iterator[None]:
    """Every test gets its own data dir; no FAULTLINE_* setting leaks in from the shell,
    and no test may talk to an LLM that is not on loopback."""
    for key in list(os.environ):
        if key.startswith("FAULTLINE_") and key != databases.ENV:
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


@pytest.fixture(scope="session")
def builtin_rulebook():
    """The built-in rule packs, parsed and compiled once for the whole run (about a second
    each time otherwise). A Rulebook is not changed by the runs that use it: learned rules
    make new programs (`Rulebook.extend`), so sharing it changes no test's outcome."""
    from rules.rulebook import Rulebook

    return Rulebook()
