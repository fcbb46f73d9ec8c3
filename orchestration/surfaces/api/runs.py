"""``/runs``: launch, list, get, cancel, answer, approve, explain and events, scoped to the caller.

Thin: each route parses the request, calls :class:`~orchestration.service.Orchestrator` and
returns its record. Another owner's run is ``404 not_found``, exactly like a missing one.
Routes are sync: FastAPI runs them in its thread pool, and the service is blocking.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from orchestration.core.errors import ValidationError
from orchestration.execution import approving
from orchestration.reads.records import RunRecord
from orchestration.reads.summaries import RunSummary
from orchestration.runs.concurrency import OnConflict
from orchestration.service import MAX_PAGE, Orchestrator
from orchestration.surfaces.api import paging
from orchestration.surfaces.api.auth import ApiOwner, Orch

router = APIRouter(prefix="/runs", tags=["runs"])


class LaunchRequest(BaseModel):
    """What to run. ``request_id`` (or the ``Idempotency-Key`` header) makes it idempotent."""

    model_config = ConfigDict(extra="forbid")

    workflow: dict[str, Any] | str = Field(
        description="The workflow definition (name and steps), or a registered one's "
        "`name` (its latest version) or `name@version`."
    )
    args: dict[str, Any] | None = Field(None, description="Values for `{{ args.* }}`.")
    request_id: str | None = Field(
        None, description="Idempotency key: the same value returns the same run."
    )
    concurrency_key: str | None = Field(
        None, description="At most one active run per (owner, key)."
    )
    on_conflict: OnConflict = Field(
        OnConflict.REJECT, description="What to do when the concurrency key is held."
    )


class AnswerRequest(BaseModel):
    """The answer to a step parked for a human."""

    model_config = ConfigDict(extra="forbid")

    step: str = Field(description="The parked step's id.")
    value: Any = Field(description="Any JSON value; the step resumes with it.")


class ApprovalRequest(BaseModel):
    """A decision on an approval step."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"] = Field(description="`approve` or `reject`.")
    comment: str | None = Field(
        None, max_length=approving.MAX_COMMENT_CHARS, description="Why; kept with it."
    )


class RerunRequest(BaseModel):
    """A rerun of an ended run."""

    model_config = ConfigDict(extra="forbid")

    from_step: str | None = Field(
        None, description="The step to rerun from (default: the first that did not complete)."
    )
    request_id: str | None = Field(None, description="Idempotency key of the new run.")


class RunPage(BaseModel):
    """One page of runs, newest first, as summaries: ``GET /runs/{id}`` has the payloads."""

    runs: list[RunSummary]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; `null` when there is none."
    )


class EventRecord(BaseModel):
    """One journal entry: a status change of the run (``step_id`` null) or of a step."""

    model_config = ConfigDict(populate_by_name=True)

    step_id: str | None
    from_: str | None = Field(alias="from")
    to: str
    cause: str
    stop_reason: str | None
    at: datetime


@router.post("", status_code=201, summary="Launch a run")
def launch(
    body: LaunchRequest,
    owner: ApiOwner,
    orch: Orch,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", description="Same as `request_id` in the body."),
    ] = None,
) -> RunRecord:
    """Validate and launch; a repeated ``request_id`` returns the existing run (also 201)."""
    request_id = body.request_id
    if idempotency_key is not None:
        if request_id is not None and request_id != idempotency_key:
            raise ValidationError("request_id", "differs from the Idempotency-Key header")
        request_id = idempotency_key
    return orch.launch(
        body.workflow,
        body.args,
        owner=owner,
        request_id=request_id,
        concurrency_key=body.concurrency_key,
        on_conflict=body.on_conflict.value,
    )


@router.get("", summary="List runs")
def list_runs(
    owner: ApiOwner,
    orch: Orch,
    status: Annotated[str | None, Query(description="Only runs with this status.")] = None,
    health: Annotated[
        str | None, Query(description="Only runs with this health (working/waiting/…).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the last page.")] = None,
    before: Annotated[
        datetime | None, Query(description="Only runs created before this time (ISO 8601).")
    ] = None,
) -> RunPage:
    """The caller's runs, newest first, one page at a time, as summaries without payloads
    (workflow, args, result, step input and output): ``GET /runs/{id}`` has those."""
    return page_of(orch, owner, status, health, limit, cursor, before)


def page_of(
    orch: Orchestrator,
    owner: str | None,
    status: str | None,
    health: str | None,
    limit: int,
    cursor: str | None,
    before: datetime | None,
) -> RunPage:
    """One page of ``owner``'s runs (every owner's for ``None``: ``/operator/runs``)."""
    runs, last = paging.page(
        orch,
        owner=owner,
        status=status,
        health=health,
        limit=limit,
        after=paging.start_key(cursor, before),
    )
    return RunPage(runs=runs, next_cursor=last.encode() if last else None)


@router.get("/{run_id}", summary="Get a run")
def get_run(run_id: str, owner: ApiOwner, orch: Orch) -> RunRecord:
    """The run with its steps and derived health."""
    return orch.get(run_id, owner=owner)


@router.get(
    "/{run_id}/steps/{step_id}/output",
    summary="A step's output",
    response_model=None,
    responses={200: {"content": {"application/json": {}, "text/plain": {}}}},
)
def step_output(run_id: str, step_id: str, owner: ApiOwner, orch: Orch) -> Response:
    """The output itself: inline as JSON, or an artifact streamed with its media type,
    ``Content-Length``, and its sha256 as the ``ETag`` (checked before the first byte);
    500 ``artifact_corrupt`` when the stored bytes no longer match the hash."""
    found = orch.output(run_id, step_id, owner=owner)
    if found.artifact is None:
        return JSONResponse(found.value)
    sha256 = found.artifact["sha256"]
    return StreamingResponse(
        orch.artifact_bytes(sha256, owner=owner),
        media_type=found.artifact["media_type"],
        headers={
            "Content-Length": str(found.artifact["size"]),
            "ETag": f'"{sha256}"',
            "X-Content-SHA256": sha256,
        },
    )


@router.post("/{run_id}/cancel", summary="Cancel a run")
def cancel(
    run_id: str,
    owner: ApiOwner,
    orch: Orch,
    graceful: Annotated[
        bool, Query(description="Only record the request; the step honours it at its next poll.")
    ] = False,
) -> RunRecord:
    """Cancel; returns the terminal ``cancelled`` record (``cancelling`` when graceful)."""
    return orch.cancel(run_id, owner=owner, graceful=graceful)


@router.post("/{run_id}/rerun", status_code=201, summary="Rerun an ended run from a step")
def rerun(run_id: str, body: RerunRequest, owner: ApiOwner, orch: Orch) -> RunRecord:
    """A new run that reuses the outputs of the steps before ``from_step`` (linked both ways:
    ``rerun_of`` and ``reruns``); 409 ``conflict`` for a live or completed run."""
    return orch.rerun(run_id, owner=owner, from_step=body.from_step, request_id=body.request_id)


@router.post("/{run_id}/answer", summary="Answer a run parked for a human")
def answer(run_id: str, body: AnswerRequest, owner: ApiOwner, orch: Orch) -> RunRecord:
    """Resume the parked step with the answer; 409 ``conflict`` if it is not waiting for one."""
    return orch.answer(run_id, body.step, body.value, owner=owner)


@router.post("/{run_id}/steps/{step_id}/approval", summary="Decide an approval step")
def approval(
    run_id: str, step_id: str, body: ApprovalRequest, owner: ApiOwner, orch: Orch
) -> RunRecord:
    """Approve (the run moves on) or reject (it fails ``approval_rejected``); 409
    ``conflict`` if the step is not waiting for a decision (decided, expired, cancelled)."""
    return orch.approve(
        run_id, step_id, owner=owner, approve=body.decision == "approve", comment=body.comment
    )


@router.get("/{run_id}/explain", summary="Explain a run")
def explain(run_id: str, owner: ApiOwner, orch: Orch) -> dict[str, Any]:
    """Why the run is where it is, what moves it next, and its ``deadline_at``."""
    return orch.explain(run_id, owner=owner)


@router.get("/{run_id}/events", summary="A run's event journal")
def events(run_id: str, owner: ApiOwner, orch: Orch) -> list[EventRecord]:
    """Every status change of the run and its steps, oldest first."""
    return [EventRecord.model_validate(event) for event in orch.events(run_id, owner=owner)]
