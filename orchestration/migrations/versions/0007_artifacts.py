"""artifacts: outputs over ORCH_INLINE_OUTPUT_BYTES stored once per owner by sha256; a step's
output and a run's result may be an artifact's reference

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_REFERENCED = "output_sha256 IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(100), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_sha256", sa.String(64), nullable=True))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("result_sha256", sa.String(64), nullable=True))
    op.create_index(
        "ix_steps_output_sha256",
        "steps",
        ["output_sha256"],
        postgresql_where=sa.text(_REFERENCED),
        sqlite_where=sa.text(_REFERENCED),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_output_sha256", table_name="steps")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("result_sha256")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("output_sha256")
    op.drop_table("artifacts")
