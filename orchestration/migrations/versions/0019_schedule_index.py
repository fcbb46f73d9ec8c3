"""schedules: one row per registered schedule with its next fire instant (the beat's pass
selects due ones by it), and stop_slots: each owner's slots for provider cancels in flight

The table is filled from the latest version of every owner's definition that carries a
schedule: its next fire is the first instant after its latest recorded fire (else after that
version's registration), none while it is paused.

Revision ID: 0019
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from orchestration.core.models import JSONType
from orchestration.workflows.schedules import ScheduleSpec, next_after

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _utc(value: Any) -> datetime:
    """A stored instant as an aware UTC datetime (SQLite returns text or naive values)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def upgrade() -> None:
    schedules = op.create_table(
        "schedules",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_schedules_next_fire", "schedules", ["next_fire_at"])
    op.create_table(
        "stop_slots",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("slot", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
    )
    _fill(schedules)


def _fill(schedules: sa.Table) -> None:
    bind = op.get_bind()
    definitions = sa.table(
        "workflow_definitions",
        sa.column("owner", sa.String),
        sa.column("name", sa.String),
        sa.column("version", sa.Integer),
        sa.column("definition", JSONType),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    fires = sa.table(
        "schedule_fires",
        sa.column("owner", sa.String),
        sa.column("name", sa.String),
        sa.column("fire_at", sa.DateTime(timezone=True)),
    )
    pauses = sa.table("schedule_pauses", sa.column("owner", sa.String), sa.column("name"))
    latest = (
        sa.select(definitions.c.owner, definitions.c.name, sa.func.max(definitions.c.version))
        .where(definitions.c.owner != "")
        .group_by(definitions.c.owner, definitions.c.name)
        .subquery()
    )
    rows = bind.execute(
        sa.select(definitions).join(
            latest,
            sa.and_(
                definitions.c.owner == latest.c.owner,
                definitions.c.name == latest.c.name,
                definitions.c.version == latest.c[2],
            ),
        )
    ).all()
    cursors = {
        (owner, name): at
        for owner, name, at in bind.execute(
            sa.select(fires.c.owner, fires.c.name, sa.func.max(fires.c.fire_at)).group_by(
                fires.c.owner, fires.c.name
            )
        )
    }
    paused = {tuple(row) for row in bind.execute(sa.select(pauses.c.owner, pauses.c.name))}
    values = []
    for owner, name, version, definition, created_at in rows:
        if "schedule" not in definition:
            continue
        spec = ScheduleSpec.model_validate(definition["schedule"])
        start = _utc(cursors.get((owner, name)) or created_at)
        at = None if (owner, name) in paused else next_after(spec, start)
        values.append({"owner": owner, "name": name, "version": version, "next_fire_at": at})
    if values:
        op.bulk_insert(schedules, values)


def downgrade() -> None:
    op.drop_table("stop_slots")
    op.drop_index("ix_schedules_next_fire", table_name="schedules")
    op.drop_table("schedules")
