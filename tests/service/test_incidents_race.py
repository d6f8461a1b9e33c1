"""Two replicas confirm the same failure at the same moment: one incident, no failed upload.

Reproduced without timing luck: session A has inserted the incident but not committed when
session B stores the same one; B waits on A's lock (PostgreSQL's unique index, SQLite's
write lock), then must skip the row instead of failing with a duplicate key. This failed,
as a 500 on an upload, before add_incidents() inserted with ON CONFLICT DO NOTHING."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import func, select

from agents.incidents import Incident, incident_id
from service.store.db import Database
from service.store.incidents import add_incidents
from service.store.models import Incident as IncidentRow
from service.settings import Settings

LINE = "[default3]:KeyError: 'optimizer_config'"


def _incident() -> Incident:
    return Incident(incident_id("confirmed", "key_error", LINE), LINE, "key_error", "user", "cause", "script",
                    "Add the key to the config.", "rule:python.key", None)


def test_the_same_incident_confirmed_twice_at_once_is_stored_once(tmp_path: Path) -> None:
    db = Database(Settings(data_dir=tmp_path / "data").database_url)
    db.create_schema()
    added: dict[str, int] = {}
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with db.session() as session:
                added["b"] = add_incidents(session, [_incident()])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    try:
        with db.session() as session:
            added["a"] = add_incidents(session, [_incident(), _incident()])  # a duplicate within one call too
            other = threading.Thread(target=second)
            other.start()
            time.sleep(0.5)  # B is now waiting on A's uncommitted row
        other.join(timeout=60)
        assert not other.is_alive()
        assert errors == []
        assert added == {"a": 1, "b": 0}
        with db.session() as session:
            assert session.scalar(select(func.count()).select_from(IncidentRow)) == 1
            assert add_incidents(session, [_incident()]) == 0
    finally:
        db.close()
