"""branches and reruns: a for_each or parallel step's branch runs point at their parent run
and step; a rerun points at the run it reruns

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_BRANCH = "parent_run_id IS NOT NULL"


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_run_id", sa.String(32), nullable=True))
        batch_op.add_column(sa.Column("parent_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("branch", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("branch_key", sa.String(80), nullable=True))
        batch_op.add_column(sa.Column("branch_context", json_type, nullable=True))
        batch_op.add_column(sa.Column("rerun_of", sa.String(32), nullable=True))
        batch_op.create_foreign_key(
            "fk_runs_parent_run_id_runs", "runs", ["parent_run_id"], ["id"], ondelete="CASCADE"
        )
    op.create_index(
        "uq_runs_branch",
        "runs",
        ["parent_run_id", "parent_step", "branch"],
        unique=True,
        postgresql_where=sa.text(_BRANCH),
        sqlite_where=sa.text(_BRANCH),
    )
    op.create_index("ix_runs_rerun_of", "runs", ["rerun_of"])


def downgrade() -> None:
    op.drop_index("ix_runs_rerun_of", table_name="runs")
    op.drop_index("uq_runs_branch", table_name="runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_runs_parent_run_id_runs", type_="foreignkey")
        batch_op.drop_column("rerun_of")
        batch_op.drop_column("branch_context")
        batch_op.drop_column("branch_key")
        batch_op.drop_column("branch")
        batch_op.drop_column("parent_step")
        batch_op.drop_column("parent_run_id")
