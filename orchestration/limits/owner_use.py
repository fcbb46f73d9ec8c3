"""What an owner uses of its budgets other than live runs, as scalar subqueries that
:mod:`.admission` puts in its statements: its registered definition versions (through the
owner's index on ``workflow_definitions``), its live provider turns (the rows triggers on
``steps`` keep, migration 0024) and its stored bytes (the sizes of its artifacts, through
their key, which starts with the owner). Each reads the owner's own rows only, so its cost is
the owner's: a plain owner's launch reads no one else's."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select

from orchestration.core.models import Artifact, LiveTurnCount, WorkflowDefinition


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
    """Bytes of ``owner``'s artifacts: the outputs over ``ORCH_INLINE_OUTPUT_BYTES`` of its
    live and kept runs (an artifact lives until a prune finds nothing referencing it). An
    inline output is in its step's row, at most ``ORCH_INLINE_OUTPUT_BYTES``, and not
    counted."""
    counted: ColumnElement[int] = (
        select(func.coalesce(func.sum(Artifact.size), 0))
        .where(Artifact.owner == owner)
        .scalar_subquery()
    )
    return counted


def live_turns(owner: Any) -> ColumnElement[int]:
    """``owner``'s provider turns started and not yet ended: its steps that are ``running``
    with a turn or with a start claimed (a start in flight counts, so a claim that took the
    last place is seen by the next), as the triggers of migration 0024 count them: at most
    16 rows read through the key, whatever the owner's live runs. Inside the start claim's
    ``UPDATE steps`` it reads the counts as of the statement's start: the claimed step is
    counted from the claim's commit on."""
    counted: ColumnElement[int] = (
        select(func.coalesce(func.sum(LiveTurnCount.live), 0))
        .where(LiveTurnCount.owner == owner)
        .scalar_subquery()
    )
    return counted
