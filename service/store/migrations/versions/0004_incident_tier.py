"""Incidents carry the evidence tier of their line (cause, symptom, ...), so the Failure Agent
weighs a retrieved symptom below a retrieved cause. Existing incidents were causes.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tier', sa.String(length=16), nullable=False, server_default='cause'))


def downgrade() -> None:
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.drop_column('tier')
