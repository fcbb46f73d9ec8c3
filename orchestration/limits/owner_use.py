"""What an owner uses of the budgets other than its live runs, as scalar subqueries that
:mod:`.admission` puts in its statements: its registered definition versions (through the
owner's index on ``workflow_definitions``), its live provider turns (through its live runs,
``ix_runs_owner_status_created``, and their steps) and its stored bytes (the sizes of its
artifacts, through their key, which starts with the owner, and the bytes of its inline
outputs, which triggers count: migration 0023). Each reads the owner's own rows only, so its
cost is the owner's: a plain owner's launch reads no one else's."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import ColumnElement, Table, func, or_, select

from orchestration.core.db import constant_in
from orchestration.core.models import (
    Artifact,
    InlineOutputBytes,
    Run,
    Step,
    WorkflowDefinition,
)
from orchestration.core.states import RUN_LIVE, StepStatus

_RUNS = cast(Table, Run.__table__)
_STEPS = cast(Table, Step.__table__)


def definitions(owner: Any) -> ColumnElement[int]:
    """The definition versions ``owner`` registered (published ones are the operator's)."""
    counted: ColumnElement[int] = (
        select(func.count())
        .select_from(WorkflowDefinition)
        .where(WorkflowDefinition.owner == owner)
        .scalar_subquery()
    )
    return counted


def stored_bytes(owner: Any) -> ColumnElement[int]:
    """Bytes of ``owner``'s stored outputs, of its live and kept runs: its artifacts (the
    outputs over ``ORCH_INLINE_OUTPUT_BYTES`` and the files outputs name, each hash once; an
    artifact lives until a prune finds nothing referencing it) and its outputs kept inline in
    their steps' rows (the stored JSON's length, counted by the database as they are written:
    at most :data:`~orchestration.limits.live_counts.SLOTS` rows read through the key)."""
    artifacts = (
        select(func.coalesce(func.sum(Artifact.size), 0))
        .where(Artifact.owner == owner)
        .scalar_subquery()
    )
    inline = (
        select(func.coalesce(func.sum(InlineOutputBytes.bytes), 0))
        .where(InlineOutputBytes.owner == owner)
        .scalar_subquery()
    )
    counted: ColumnElement[int] = select(artifacts + inline).scalar_subquery()
    return counted


def live_turns(owner: Any) -> ColumnElement[int]:
    """``owner``'s provider turns started and not yet ended: its live runs' (branch runs
    included) steps that are ``running`` with a turn, or with a start claimed (a start in
    flight counts, so a claim that took the last place is seen by the next). Read through
    aliases of its own: inside the start claim's ``UPDATE steps`` it counts other rows,
    never the updated one by correlation."""
    runs = _RUNS.alias("turn_runs")
    steps = _STEPS.alias("turn_steps")
    counted: ColumnElement[int] = (
        select(func.count())
        .select_from(runs.join(steps, steps.c.run_id == runs.c.id))
        .where(
            runs.c.owner == owner,
            constant_in(runs.c.status, (status.value for status in RUN_LIVE)),
            steps.c.status == StepStatus.RUNNING.value,
            or_(steps.c.provider_run_id.is_not(None), steps.c.start_claimed_at.is_not(None)),
        )
        .scalar_subquery()
    )
    return counted
