"""What an owner uses of its budgets other than live runs, as scalar subqueries that
:mod:`.admission` puts in its statements: its registered definition versions (through the
owner's index on ``workflow_definitions``), its live provider turns (the rows triggers on
``steps`` keep, migration 0024) and its stored bytes (the sizes of its artifacts, through
their key, which starts with the owner, and the bytes of its inline outputs, which triggers
count: migration 0023). Each reads the owner's own rows only, so its cost is the owner's: a
plain owner's launch reads no one else's."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select

from orchestration.core.db import constant
from orchestration.core.models import Artifact, InlineOutputBytes, LiveTurnCount, WorkflowDefinition


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
        select(func.coalesce(func.sum(Artifact.size), constant(0)))
        .where(Artifact.owner == owner)
        .scalar_subquery()
    )
    inline = (
        select(func.coalesce(func.sum(InlineOutputBytes.bytes), constant(0)))
        .where(InlineOutputBytes.owner == owner)
        .scalar_subquery()
    )
    counted: ColumnElement[int] = select(artifacts + inline).scalar_subquery()
    return counted


def live_turns(owner: Any) -> ColumnElement[int]:
    """``owner``'s provider turns started and not yet ended: its steps that are ``running``
    with a turn or with a start claimed (a start in flight counts, so a claim that took the
    last place is seen by the next), as the triggers of migration 0024 count them: at most
    16 rows read through the key, whatever the owner's live runs. Inside the start claim's
    ``UPDATE steps`` it reads the counts as of the statement's start: the claimed step is
    counted from the claim's commit on."""
    counted: ColumnElement[int] = (
        select(func.coalesce(func.sum(LiveTurnCount.live), constant(0)))
        .where(LiveTurnCount.owner == owner)
        .scalar_subquery()
    )
    return counted
