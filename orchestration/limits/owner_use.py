"""What an owner uses of the budgets the database does not keep as counts: its registered
definition versions (read through the owner's index on ``workflow_definitions``), as scalar
subqueries that :mod:`.admission` puts in its statements."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, func, select

from orchestration.core.models import WorkflowDefinition


def definitions(owner: Any) -> ColumnElement[int]:
    """The definition versions ``owner`` registered (published ones are the operator's)."""
    counted: ColumnElement[int] = (
        select(func.count())
        .select_from(WorkflowDefinition)
        .where(WorkflowDefinition.owner == owner)
        .scalar_subquery()
    )
    return counted
