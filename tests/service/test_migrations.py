"""Alembic migrations on the database of this run (SQLite, or PostgreSQL in the PostgreSQL
run): the head revision is exactly the models, old databases are adopted, replicas that
start together migrate once, and `faultline db` works as an operator uses it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from service.store import migrate

from service.store import jobs as store
from service.store.db import Database
from service.errors import ConfigError
from service.store.models import Base, Counter, Job
from service.settings import Settings
from tests.support import databases
from tests.support.databases import cli_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path):
    database = Database(Settings(data_dir=tmp_path / "data").database_url)
    yield database
    database.close()


def differences(database: Database) -> list:
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, Base.metadata)


def test_the_suite_runs_on_the_backend_it_was_asked_for(db: Database) -> None:
    assert db.backend == ("postgresql" if databases.server_url() else "sqlite")


def test_the_migrations_replayed_from_nothing_are_exactly_the_models(db: Database) -> None:
    with db.engine.begin() as connection:  # every script in turn, as an old database meets them
        command.upgrade(migrate.alembic_config(connection), "head")
    assert differences(db) == []
    with db.engine.connect() as connection:
        assert migrate.current_revision(connection) == migrate.head_revision()
    with db.session() as session:
        assert session.get(Counter, store.RULES_COUNTER).value == 0


def test_a_new_database_gets_the_head_schema_that_alembic_can_migrate_on(db: Database) -> None:
    assert not migrate.is_current(db.engine)  # an empty database: made from the models, stamped
    assert migrate.upgrade(db.engine) is None
    assert differences(db) == []
    with db.engine.begin() as connection:  # Alembic reads the stamp and walks down and up from it
        assert migrate.current_revision(connection) == migrate.head_revision()
        command.downgrade(migrate.alembic_config(connection), migrate.BASELINE)
        command.upgrade(migrate.alembic_config(connection), "head")
    assert differences(db) == []
    with db.engine.connect() as connection:
        assert migrate.current_revision(connection) == migrate.head_revision()
    # the start-up's check reads the version table against HEAD, without Alembic
    assert migrate.HEAD == migrate.head_revision() and migrate.is_current(db.engine)
    assert migrate.upgrade(db.engine) == migrate.HEAD
    with db.session() as session:  # replicas only ever UPDATE the counter
        assert session.get(Counter, store.RULES_COUNTER).value == 0


def test_downgrade_to_nothing_and_back_leaves_the_same_schema(db: Database) -> None:
    db.create_schema()
    with db.engine.begin() as connection:
        command.downgrade(migrate.alembic_config(connection), "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    db.create_schema()
    assert differences(db) == []


def test_a_database_made_before_migrations_is_adopted_with_its_rows(db: Database) -> None:
    with db.engine.begin() as connection:  # what create_all made: the baseline, no version table
        command.upgrade(migrate.alembic_config(connection), migrate.BASELINE)
        connection.execute(text("DROP TABLE alembic_version"))
        connection.execute(text("INSERT INTO jobs (id, name, family, tags, status, live, created_at, updated_at, "
                                "lines_received, bytes_received, meta) VALUES ('old-job', 'gpt-7b', 'gpt-7b', "
                                "'[]', 'failed', false, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 10, 100, '{}')"))
    assert migrate.upgrade(db.engine) == migrate.BASELINE
    assert differences(db) == []
    with db.session() as session:
        assert session.scalar(select(Job.name).where(Job.id == "old-job")) == "gpt-7b"


def test_replicas_starting_together_migrate_once(tmp_path: Path) -> None:
    url = Settings(data_dir=tmp_path / "data").database_url
    replicas = [Database(url) for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(replicas))

    def boot(database: Database) -> None:
        try:
            start.wait()
            database.create_schema()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=boot, args=(r,)) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        assert differences(replicas[0]) == []
        with replicas[0].session() as session:
            assert session.scalar(select(Counter.value).where(Counter.name == store.RULES_COUNTER)) == 0
    finally:
        for database in replicas:
            database.close()


def test_with_auto_upgrade_off_an_old_schema_is_refused(db: Database) -> None:
    with db.engine.begin() as connection:
        command.upgrade(migrate.alembic_config(connection), migrate.BASELINE)
    with pytest.raises(ConfigError, match="faultline db upgrade"):
        db.require_current_schema()


def faultline(*args: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLINE_")}
    environ.update(cli_env(data_dir), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          env=environ, cwd=ROOT, timeout=300)


def test_faultline_db_upgrade_as_an_operator_runs_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "job.log"
    log.write_text("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    done = faultline("db", "current", data_dir=data)
    assert done.returncode == 0 and done.stdout.strip() == f"none (behind {migrate.head_revision()})"
    refused = faultline("diagnose", str(log), data_dir=data, FAULTLINE_DB_AUTO_UPGRADE="false")
    assert refused.returncode == 2 and "run `faultline db upgrade`" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    done = faultline("db", "upgrade", data_dir=data)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"database schema: empty -> {migrate.head_revision()}"
    done = faultline("diagnose", str(log), "--json", data_dir=data, FAULTLINE_DB_AUTO_UPGRADE="false")
    assert done.returncode == 0, done.stderr
    assert faultline("db", "current", data_dir=data).stdout.strip() == f"{migrate.head_revision()} (current)"
