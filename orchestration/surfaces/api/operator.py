"""``/operator``: an operator's token reads every owner's runs and cancels any of them (and
suspends owners: :mod:`.owner_suspensions`).

An owner's token gets ``403 forbidden`` on every route here (and an operator's token on the
owner routes). Each route acts as the run's owner through the same service calls as
``/runs``, and a cancel is journalled with the operator token's name (``cancel requested by
operator NAME``), so the run's owner sees who stopped it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from orchestration.reads.records import RunRecord
from orchestration.service import MAX_PAGE
from orchestration.surfaces.api.auth import ApiOperator, Orch
from orchestration.surfaces.api.runs import EventRecord, RunPage, page_of

router = APIRouter(prefix="/operator", tags=["operator"])


@router.get("/runs", summary="Every owner's runs")
def list_runs(
    operator: ApiOperator,
    orch: Orch,
    owner: Annotated[str | None, Query(description="Only this owner's runs.")] = None,
    status: Annotated[str | None, Query(description="Only runs with this status.")] = None,
    health: Annotated[str | None, Query(description="Only runs with this health.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the last page.")] = None,
    before: Annotated[datetime | None, Query(description="Only runs created before.")] = None,
) -> RunPage:
    """Runs of every owner (each summary names its ``owner``), newest first, a page at a
    time; ``owner`` filters to one."""
    return page_of(orch, owner, status, health, limit, cursor, before)


@router.get("/runs/{run_id}", summary="Any owner's run")
def get_run(run_id: str, operator: ApiOperator, orch: Orch) -> RunRecord:
    """The run with its steps and derived health, whoever owns it."""
    return orch.get(run_id, owner=orch.owner_of(run_id))


@router.get("/runs/{run_id}/events", summary="Any owner's run's journal")
def events(run_id: str, operator: ApiOperator, orch: Orch) -> list[EventRecord]:
    """Every status change of the run and its steps, oldest first."""
    owner = orch.owner_of(run_id)
    return [EventRecord.model_validate(event) for event in orch.events(run_id, owner=owner)]


@router.post("/runs/{run_id}/cancel", summary="Cancel any owner's run")
def cancel(
    run_id: str,
    operator: ApiOperator,
    orch: Orch,
    graceful: Annotated[bool, Query(description="Only record the request.")] = False,
) -> RunRecord:
    """Cancel as ``POST /runs/{id}/cancel`` does, journalled as ``operator NAME``."""
    return orch.cancel(
        run_id, owner=orch.owner_of(run_id), graceful=graceful, by=f"operator {operator}"
    )
