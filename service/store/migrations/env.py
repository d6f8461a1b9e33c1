"""Alembic environment: always given a connection by service.store.migrate (no alembic.ini, no URL
in a file), so the same code migrates SQLite and PostgreSQL, from the CLI or at start."""

from __future__ import annotations

from alembic import context

from service.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through service.store.migrate (faultline db upgrade), not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place: batch mode copies the table instead
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
