"""Live jobs: per-file sources, the webhook outbox, the scheduler's job id; the chunk
ledger is keyed by file too.

The ledger (job_chunks) only remembers recent chunks so that a resend is acknowledged once;
before this revision no live job had a job_sources row to continue from, so the ledger is
rebuilt empty with its new key rather than migrated.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('job_sources',
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=512), nullable=False),
    sa.Column('file_id', sa.String(length=128), nullable=False),
    sa.Column('first_offset', sa.BigInteger(), nullable=False),
    sa.Column('next_offset', sa.BigInteger(), nullable=False),
    sa.Column('lines', sa.BigInteger(), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('crc32', sa.BigInteger(), nullable=False),
    sa.Column('chunks', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'source', 'file_id')
    )
    op.create_table('notifications',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_notifications_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_next_attempt_at'), ['next_attempt_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_status'), ['status'], unique=False)

    op.drop_table('job_chunks')
    _chunk_ledger('file_id')

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('external_id', sa.String(length=256), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_external_id'), ['external_id'], unique=False)
        batch_op.create_index('ux_jobs_open_external_id', ['external_id'], unique=True, sqlite_where=sa.text('finished_at IS NULL'), postgresql_where=sa.text('finished_at IS NULL'))



def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ux_jobs_open_external_id', sqlite_where=sa.text('finished_at IS NULL'), postgresql_where=sa.text('finished_at IS NULL'))
        batch_op.drop_index(batch_op.f('ix_jobs_external_id'))
        batch_op.drop_column('external_id')

    op.drop_table('job_chunks')
    _chunk_ledger()

    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_notifications_status'))
        batch_op.drop_index(batch_op.f('ix_notifications_next_attempt_at'))
        batch_op.drop_index(batch_op.f('ix_notifications_job_id'))

    op.drop_table('notifications')
    op.drop_table('job_sources')


def _chunk_ledger(*file_id: str) -> None:
    op.create_table('job_chunks',
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=512), nullable=False),
    *[sa.Column(name, sa.String(length=128), nullable=False) for name in file_id],
    sa.Column('offset', sa.BigInteger(), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('lines', sa.Integer(), nullable=False),
    sa.Column('checksum', sa.String(length=64), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'source', *file_id, 'offset')
    )
