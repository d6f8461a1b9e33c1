"""The test suite's databases: SQLite files by default, PostgreSQL when
FAULTLINE_TEST_DATABASE_URL names a server (`make test` runs the suite both ways).

On PostgreSQL every data dir a test (or a fixture) uses gets a database of its own, made on
first use with a random name and dropped when that test or fixture is torn down, so runs can
share a server with other users and with each other. The hook is one function,
`service.settings.default_database_url`, which tests/conftest.py points here; subprocesses
get the same database through `cli_env(data_dir)`.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

ENV = "FAULTLINE_TEST_DATABASE_URL"
NAME_PREFIX = "faultline_test_"


def server_url() -> str | None:
    """The PostgreSQL server the suite runs on, or None for SQLite."""
    return os.environ.get(ENV) or None


def shown_url() -> str:
    """The server URL without its password, for messages."""
    url = server_url()
    return make_url(url).render_as_string(hide_password=True) if url else ""


def _libpq(url: str, database: str | None = None) -> str:
    """A SQLAlchemy URL as psycopg wants it (no driver suffix), optionally another database."""
    parsed = make_url(url).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


class PostgresDatabases:
    """Creates and drops test databases on one server; one per data dir."""

    def __init__(self, url: str):
        self.url = url
        self._by_dir: dict[Path, str] = {}
        self._lock = threading.Lock()

    def check(self) -> str | None:
        """None when the server answers, else why not."""
        try:
            with psycopg.connect(_libpq(self.url), connect_timeout=3, autocommit=True) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None

    def create(self) -> str:
        """A new empty database; returns its SQLAlchemy URL (psycopg 3)."""
        name = NAME_PREFIX + secrets.token_hex(6)
        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return make_url(_libpq(self.url, name)).set(drivername="postgresql+psycopg").render_as_string(
            hide_password=False)

    def drop(self, url: str) -> None:
        name = make_url(url).database
        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            # FORCE: a server a test left running may still hold connections
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def for_data_dir(self, data_dir: Path, register_drop: Callable[[Callable[[], None]], None]) -> str:
        """The database of a data dir, created on first use; `register_drop` is given the
        function that drops it (the test's or fixture's finalizer)."""
        key = Path(data_dir).resolve()
        with self._lock:
            url = self._by_dir.get(key)
            if url is None:
                url = self._by_dir[key] = self.create()

                def drop() -> None:
                    with self._lock:
                        self._by_dir.pop(key, None)
                    self.drop(url)

                register_drop(drop)
            return url


_active: PostgresDatabases | None = None
_register: Callable[[Callable[[], None]], None] | None = None


def activate(databases: PostgresDatabases | None, register: Callable[[Callable[[], None]], None] | None) -> None:
    global _active, _register
    _active, _register = databases, register


def database_url(data_dir: Path) -> str:
    """The URL the service uses for a data dir in this run."""
    if _active is None or _register is None:
        return f"sqlite:///{Path(data_dir) / 'faultline.db'}"
    return _active.for_data_dir(data_dir, _register)


def cli_env(data_dir: Path) -> dict[str, str]:
    """Environment for a `faultline` subprocess on `data_dir`, on this run's database."""
    env = {"FAULTLINE_DATA_DIR": str(data_dir)}
    if _active is not None:
        env["FAULTLINE_DATABASE_URL"] = database_url(data_dir)
    return env


def new_database() -> tuple[str, Callable[[], None]]:
    """A database that is nobody's data dir (e.g. shared by two server processes): its URL
    and the function that drops it. SQLite: a file in a fresh temporary folder."""
    if _active is None:
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="faultline-db-")
        return f"sqlite:///{folder}/faultline.db", lambda: shutil.rmtree(folder, ignore_errors=True)
    active = _active
    url = active.create()
    return url, lambda: active.drop(url)
