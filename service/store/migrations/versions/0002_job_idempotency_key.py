"""Jobs remember the Idempotency-Key of the request that stored them; the rules_version
counter row exists from the start, so replicas only ever UPDATE it (never race to insert).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=128), nullable=True))
        batch_op.create_index("ix_jobs_idempotency_key", ["idempotency_key"], unique=True)
    op.execute("INSERT INTO counters (name, value) SELECT 'rules_version', 0 "
               "WHERE NOT EXISTS (SELECT 1 FROM counters WHERE name = 'rules_version')")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_index("ix_jobs_idempotency_key")
        batch_op.drop_column("idempotency_key")
