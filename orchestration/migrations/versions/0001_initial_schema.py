"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("workflow_name", sa.String(length=200), nullable=False),
        sa.Column(
            "workflow",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "args",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("stop_reason", sa.String(length=40), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "result",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "task_ids",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("current_step", sa.Integer(), nullable=False),
        sa.Column("rearms", sa.Integer(), nullable=False),
        sa.Column("park_reason", sa.String(length=40), nullable=True),
        sa.Column("parked_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("waiting_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("concurrency_key", sa.String(length=200), nullable=True),
        sa.Column("on_conflict", sa.String(length=20), nullable=True),
        sa.Column("claim", sa.String(length=20), nullable=True),
        sa.Column("needs_review", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "request_id", name="uq_runs_owner_request"),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_live",
            ["status", "deadline_at"],
            unique=False,
            postgresql_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')"
            ),
            sqlite_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')"
            ),
        )
        batch_op.create_index(
            "ix_runs_live_claim",
            ["owner", "concurrency_key", "created_at"],
            unique=False,
            postgresql_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting') AND concurrency_key IS NOT NULL"
            ),
            sqlite_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting') AND concurrency_key IS NOT NULL"
            ),
        )
        batch_op.create_index("ix_runs_owner_created", ["owner", "created_at"], unique=False)
        batch_op.create_index(
            "uq_runs_claim_holder",
            ["owner", "concurrency_key"],
            unique=True,
            postgresql_where=sa.text("claim = 'holding'"),
            sqlite_where=sa.text("claim = 'holding'"),
        )

    op.create_table(
        "sweeper_beats",
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("last_pass_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_pass_seconds", sa.Double(), nullable=False),
        sa.Column(
            "last_report",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("run_id", "step_index", "attempt", name="uq_checkpoints"),
    )
    op.create_table(
        "effects",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("run_id", "step_index", "attempt", "kind", name="uq_effects_step_kind"),
    )
    with op.batch_alter_table("effects", schema=None) as batch_op:
        batch_op.create_index("ix_effects_run", ["run_id", "status"], unique=False)

    op.create_table(
        "run_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("step_id", sa.String(length=80), nullable=True),
        sa.Column("from_status", sa.String(length=20), nullable=True),
        sa.Column("to_status", sa.String(length=20), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("stop_reason", sa.String(length=40), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.create_index("ix_run_events_run", ["run_id", "id"], unique=False)

    op.create_table(
        "steps",
        sa.Column("pk", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("step_id", sa.String(length=80), nullable=False),
        sa.Column("provider", sa.String(length=80), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("provider_run_id", sa.String(length=200), nullable=True),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "output",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("polls", sa.Integer(), nullable=False),
        sa.Column("last_provider_status", sa.String(length=200), nullable=True),
        sa.Column(
            "prompt",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "answer",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("celery_task_id", sa.String(length=64), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_poll_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("pk"),
        sa.UniqueConstraint("run_id", "index", name="uq_steps_run_index"),
    )


def downgrade() -> None:
    op.drop_table("steps")
    with op.batch_alter_table("run_events", schema=None) as batch_op:
        batch_op.drop_index("ix_run_events_run")

    op.drop_table("run_events")
    with op.batch_alter_table("effects", schema=None) as batch_op:
        batch_op.drop_index("ix_effects_run")

    op.drop_table("effects")
    op.drop_table("checkpoints")
    op.drop_table("sweeper_beats")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_runs_claim_holder",
            postgresql_where=sa.text("claim = 'holding'"),
            sqlite_where=sa.text("claim = 'holding'"),
        )
        batch_op.drop_index("ix_runs_owner_created")
        batch_op.drop_index(
            "ix_runs_live_claim",
            postgresql_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting') AND concurrency_key IS NOT NULL"
            ),
            sqlite_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting') AND concurrency_key IS NOT NULL"
            ),
        )
        batch_op.drop_index(
            "ix_runs_live",
            postgresql_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')"
            ),
            sqlite_where=sa.text(
                "status IN ('cancelling', 'parked', 'queued', 'running', 'waiting')"
            ),
        )

    op.drop_table("runs")
