"""Initial schema: the tables as `create_all` made them before migrations existed (a
database from that time is stamped with this revision, then upgraded).

Revision ID: 0001
Revises: -
Create Date: 2026-11-24 01:19:21.522388
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=256), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_at'), ['at'], unique=False)

    op.create_table('counters',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('incidents',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('category', sa.String(length=32), nullable=True),
    sa.Column('origin', sa.String(length=16), nullable=False),
    sa.Column('mitigation', sa.Text(), nullable=False),
    sa.Column('confirmed_by', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=True),
    sa.Column('embedding', sa.LargeBinary(), nullable=True),
    sa.Column('embedding_model', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_incidents_reason'), ['reason'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=512), nullable=False),
    sa.Column('family', sa.String(length=512), nullable=False),
    sa.Column('framework', sa.String(length=64), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('live', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_output_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_progress_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('lines_received', sa.BigInteger(), nullable=False),
    sa.Column('bytes_received', sa.BigInteger(), nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('diagnosis', sa.JSON(), nullable=True),
    sa.Column('reason', sa.String(length=64), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_family'), ['family'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_name'), ['name'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_reason'), ['reason'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_status'), ['status'], unique=False)

    op.create_table('rule_versions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('rule_id', sa.String(length=128), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('changed_by', sa.String(length=128), nullable=False),
    sa.Column('change', sa.String(length=32), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rule_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rule_versions_rule_id'), ['rule_id'], unique=False)

    op.create_table('rules',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('scope', sa.String(length=256), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('pattern', sa.Text(), nullable=False),
    sa.Column('patterns', sa.JSON(), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=True),
    sa.Column('tier', sa.String(length=16), nullable=True),
    sa.Column('origin', sa.String(length=16), nullable=True),
    sa.Column('action', sa.String(length=32), nullable=True),
    sa.Column('mitigation', sa.Text(), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('provenance', sa.JSON(), nullable=False),
    sa.Column('hits', sa.BigInteger(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('review_note', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('rules', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rules_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_rules_scope'), ['scope'], unique=False)
        batch_op.create_index(batch_op.f('ix_rules_source'), ['source'], unique=False)
        batch_op.create_index(batch_op.f('ix_rules_status'), ['status'], unique=False)

    op.create_table('job_chunks',
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=512), nullable=False),
    sa.Column('offset', sa.BigInteger(), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('lines', sa.Integer(), nullable=False),
    sa.Column('checksum', sa.String(length=64), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'source', 'offset')
    )
    op.create_table('job_states',
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('blob', sa.LargeBinary(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id')
    )
    op.create_table('kept_lines',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=512), nullable=False),
    sa.Column('line_number', sa.BigInteger(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('error_like', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('kept_lines', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_kept_lines_job_id'), ['job_id'], unique=False)
        batch_op.create_index('ix_kept_lines_job_line', ['job_id', 'source', 'line_number'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('kept_lines', schema=None) as batch_op:
        batch_op.drop_index('ix_kept_lines_job_line')
        batch_op.drop_index(batch_op.f('ix_kept_lines_job_id'))

    op.drop_table('kept_lines')
    op.drop_table('job_states')
    op.drop_table('job_chunks')
    with op.batch_alter_table('rules', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rules_status'))
        batch_op.drop_index(batch_op.f('ix_rules_source'))
        batch_op.drop_index(batch_op.f('ix_rules_scope'))
        batch_op.drop_index(batch_op.f('ix_rules_kind'))

    op.drop_table('rules')
    with op.batch_alter_table('rule_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rule_versions_rule_id'))

    op.drop_table('rule_versions')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_status'))
        batch_op.drop_index(batch_op.f('ix_jobs_reason'))
        batch_op.drop_index(batch_op.f('ix_jobs_name'))
        batch_op.drop_index(batch_op.f('ix_jobs_family'))
        batch_op.drop_index(batch_op.f('ix_jobs_created_at'))

    op.drop_table('jobs')
    with op.batch_alter_table('incidents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_incidents_reason'))

    op.drop_table('incidents')
    op.drop_table('counters')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_at'))

    op.drop_table('audit_log')
