"""Deleting runs over HTTP: ``DELETE /runs/{id}`` for the run's owner, and ``GET
/operator/deletions``, the audit of what owners deleted, for an operator.

Another owner's run is ``404 not_found``, like a missing one; a live run, a branch run or a
run still cleaning up is ``409 conflict``, its message saying why and what to do
(:mod:`orchestration.runs.deletion`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from orchestration.core.followups import Done
from orchestration.runs import deletion
from orchestration.surfaces.api.auth import ApiOperator, ApiOwner, Orch
from orchestration.upkeep import retention

router = APIRouter()

#: Deletions one ``GET /operator/deletions`` returns at most.
MAX_DELETIONS = 500


class DeletionRecord(BaseModel):
    """One deleted run, as the audit keeps it."""

    run_id: str
    owner: str
    workflow: str = Field(description="`name@version` of a registered definition, else the name.")
    status: str = Field(description="The status the run had ended in.")
    deleted_at: datetime
    by: str = Field(
        description="Through what its owner deleted it: `api`, `cli (user)`, `dashboard` or "
        "`python`."
    )
    branch_runs: int = Field(description="Branch runs deleted with it.")


class DeletedRun(DeletionRecord):
    """What a delete removed: rows per table and the artifacts nothing else referenced."""

    rows: dict[str, int]
    artifacts: int


@router.delete("/runs/{run_id}", tags=["runs"], summary="Delete an ended run")
def delete_run(run_id: str, owner: ApiOwner, orch: Orch) -> DeletedRun:
    """Delete the run, its branch runs, its journal and the artifacts nothing else references;
    recorded for operators (``GET /operator/deletions``). 409 ``conflict`` for a live run or one
    still cleaning up (the message says what to do)."""
    done = retention.delete_run(
        orch.transact, orch.settings, run_id, owner=owner, by="api", now=orch.clock()
    )
    return DeletedRun(
        run_id=done.run_id,
        owner=done.owner,
        workflow=done.workflow,
        status=done.status,
        deleted_at=done.deleted_at,
        by=done.by,
        branch_runs=done.deleted.counts["branch_runs"],
        rows=done.deleted.counts,
        artifacts=done.artifacts,
    )


@router.get("/operator/deletions", tags=["operator"], summary="Runs their owners deleted")
def deletions(
    operator: ApiOperator,
    orch: Orch,
    owner: Annotated[str | None, Query(description="Only this owner's deletions.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_DELETIONS)] = 50,
) -> list[DeletionRecord]:
    """The latest deletions, newest first."""
    rows = orch.transact(lambda session: Done(deletion.listing(session, owner=owner, limit=limit)))
    return [DeletionRecord.model_validate(row) for row in rows]
