"""Schema migrations (Alembic), the same scripts for SQLite and PostgreSQL.

The schema lives in `service/store/migrations/versions/`; `service/store/models.py` is what the code
expects, and a test checks that the head revision and the models agree. The service brings
the database to the head revision when it starts (`FAULTLINE_DB_AUTO_UPGRADE`, default on)
or an operator runs `faultline db upgrade` first. Several replicas may start at once: the
upgrade runs under a lock (a PostgreSQL advisory lock, a file lock beside a SQLite file), and
the one that comes second finds the work done. A new, empty database gets the head schema
from the models at once, stamped as Alembic would (a test holds it equal to the replayed
migrations).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import OperationalError, ProgrammingError

from service.errors import ConfigError

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where it does work (an upgrade, a revision read), not to learn that the
# schema is current: importing it was 0.28 s of every `faultline diagnose`.

SCRIPT_LOCATION = "service.store:migrations"
BASELINE = "0001"
"""The first revision: the schema that `create_all` made before there were migrations."""
HEAD = "0004"
"""The newest revision in migrations/versions/, so that a start on a current schema needs no
Alembic; a test holds it to Alembic's own reading of the scripts (head_revision)."""
_LOCK_KEY = 0x6661756C746C696E  # "faultlin": one advisory lock id for every Faultline database


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads, not one: {heads}")
    return heads[0]


def current_revision(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def is_current(engine: Engine) -> bool:
    """Whether the schema is at HEAD, read with one query (Alembic's own version table)."""
    with engine.connect() as connection:
        try:
            found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        except (OperationalError, ProgrammingError):  # no version table: a new or pre-migration database
            return False
    return found == [HEAD]


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Bring the database to `revision`; returns the revision it was at before."""
    if revision == "head" and is_current(engine):
        return HEAD  # the common case, without taking a lock (nor importing Alembic)
    with _migration_lock(engine) as connection:
        if revision == "head" and not inspect(connection).get_table_names():
            _create_head(connection)  # a new database: no migration to replay
            return None
        from alembic import command

        before = current_revision(connection)
        if before is None and inspect(connection).has_table("jobs"):
            # a database made by create_all before migrations existed: it is the baseline
            command.stamp(alembic_config(connection), BASELINE)
            before = BASELINE
        command.upgrade(alembic_config(connection), revision)
        return before


def _create_head(connection: Connection) -> None:
    """The head schema straight from the models, stamped HEAD the way Alembic stamps it.

    Replaying every migration on a new, empty database gives the same schema (a test holds
    the two to each other) but costs Alembic's import and one DDL round per step: about 0.3 s
    of a first `faultline diagnose` or `compress` on a fresh data directory."""
    from service.store.jobs import RULES_COUNTER
    from service.store.models import Base

    Base.metadata.create_all(connection)
    # what 0002 seeds: replicas only ever UPDATE the counter
    connection.execute(text("INSERT INTO counters (name, value) VALUES (:name, 0)"), {"name": RULES_COUNTER})
    connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
                            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"))
    connection.execute(text("INSERT INTO alembic_version (version_num) VALUES (:head)"), {"head": HEAD})


def require_current(engine: Engine) -> None:
    """Refuse to run on a schema the code does not match (auto-upgrade turned off)."""
    with engine.connect() as connection:
        found = current_revision(connection)
    if found != head_revision():
        raise ConfigError(f"the database schema is at revision {found or 'none'}, this version needs "
                          f"{head_revision()}: run `faultline db upgrade` (or set FAULTLINE_DB_AUTO_UPGRADE=true)")


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the migration lock until it commits."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            yield connection
        return
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        # SQLite runs DDL outside transactions (pysqlite), so processes take turns on a file lock
        with open(f"{database}.migrate-lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            with engine.begin() as connection:
                yield connection
        return
    with engine.begin() as connection:
        yield connection
