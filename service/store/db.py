"""Database engine and sessions. No import-time engine: each app or CLI run opens its own."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from service.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger("faultline.database")


@dataclass(frozen=True)
class PoolOptions:
    """Connection pool of a server database (PostgreSQL); SQLite files need none."""

    size: int = 10
    max_overflow: int = 20
    timeout_s: float = 10.0
    """How long a request waits for a free connection before it fails."""
    recycle_s: int = 1800
    connect_timeout_s: int = 5
    """A database that does not answer fails a request (503) in seconds, not minutes."""


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 (SQLAlchemy would pick psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str, pool: PoolOptions | None = None) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn, _record) -> None:  # concurrent readers while one writes
            cursor = conn.cursor()
            _switch_to_wal(cursor)
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    pool = pool or PoolOptions()
    connect_args = {"connect_timeout": pool.connect_timeout_s} if make_url(url).get_backend_name() == "postgresql" else {}
    # pre-ping: a connection the server closed (a restart, a failover) is replaced before a
    # request gets it, so the first request after the database returns succeeds
    return create_engine(url, pool_pre_ping=True, pool_size=pool.size, max_overflow=pool.max_overflow,
                         pool_timeout=pool.timeout_s, pool_recycle=pool.recycle_s, connect_args=connect_args)


def _switch_to_wal(cursor, *, attempts: int = 200, pause_s: float = 0.05) -> None:
    """SQLite answers "database is locked" at once, without waiting out its busy timeout,
    when several connections switch a new file to WAL together (replicas starting at once):
    try again for a while."""
    for attempt in Retrying(retry=retry_if_exception(_locked), stop=stop_after_attempt(attempts),
                            wait=wait_fixed(pause_s), reraise=True):
        with attempt:
            cursor.execute("PRAGMA journal_mode=WAL")


def _locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


class Database:
    def __init__(self, url: str, *, pool: PoolOptions | None = None):
        self.url = normalise_url(url)
        self.engine = make_engine(self.url, pool)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session, session.begin():
            yield session

    def create_schema(self) -> None:
        """Bring the schema to the head revision of the migrations (service/store/migrate.py)."""
        from service.store.migrate import upgrade

        upgrade(self.engine)

    def require_current_schema(self) -> None:
        from service.store.migrate import require_current

        require_current(self.engine)

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()


def open_database(settings: Settings) -> Database:
    """The database of the settings, its schema at the head revision (upgraded, or checked
    when FAULTLINE_DB_AUTO_UPGRADE is off)."""
    db = Database(settings.database_url, pool=PoolOptions(
        size=settings.db_pool_size, max_overflow=settings.db_max_overflow,
        timeout_s=settings.db_pool_timeout_s, connect_timeout_s=settings.db_connect_timeout_s))
    where = make_url(db.url).render_as_string(hide_password=True)

    def say_why(attempt: RetryCallState) -> None:
        log.warning("the database at %s cannot be reached (%s); retrying in %.0f s", where,
                    _first_line(attempt.outcome.exception()), attempt.next_action.sleep)

    try:
        # a SQLite file that cannot be opened will not open later: only a server is waited for
        wait_s = settings.db_start_wait_s if db.backend != "sqlite" else 0
        for attempt in Retrying(retry=retry_if_exception_type(OperationalError), reraise=True,
                                stop=stop_after_delay(wait_s),
                                wait=wait_exponential(multiplier=1, min=1, max=10), before_sleep=say_why):
            with attempt:
                if settings.db_auto_upgrade:
                    db.create_schema()
                else:
                    db.require_current_schema()
    except OperationalError as exc:
        db.close()
        waited = f" after {wait_s:.0f} s of retrying" if wait_s else ""
        raise DatabaseUnavailable(f"the database at {where} cannot be reached{waited}: {_first_line(exc)}") from None
    except BaseException:
        db.close()
        raise
    return db


def _first_line(exc: BaseException | None) -> str:
    """The driver's own words (`connection refused`), without SQLAlchemy's statement and link."""
    cause = getattr(exc, "orig", None) or exc
    return str(cause).strip().splitlines()[0][:300] if cause is not None else "unknown error"
