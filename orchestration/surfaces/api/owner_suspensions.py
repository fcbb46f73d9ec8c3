"""``/operator/owners``: an operator suspends an owner (and cancels its live runs), resumes it,
lists the suspended owners and reads one owner's audit.

The same calls as ``orchestration owners suspend|resume|suspended`` (the Python API's
:class:`~orchestration.owner_suspensions.OwnerSuspensions`), acting as ``operator NAME``, the
operator token's name, as the audit and the cancelled runs' journals show it. An owner's
token gets ``403 forbidden`` (and a suspended owner's, ``403 owner_suspended``). A bad owner or
reason is ``400 validation_error`` naming the field, and nothing is written or cancelled.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from orchestration.limits import suspensions
from orchestration.surfaces.api.auth import ApiOperator, Orch

router = APIRouter(prefix="/operator/owners", tags=["operator"])

#: Audit rows one ``GET /operator/owners/{owner}/suspension`` returns at most.
MAX_EVENTS = 500


class SuspendRequest(BaseModel):
    """Why the owner is suspended, and whether its live runs end now."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        description="Why, as every refusal of the owner's work says it "
        f"(1-{suspensions.MAX_REASON_CHARS} characters once whitespace is collapsed)."
    )
    cancel_live: bool = Field(
        False, description="Also cancel every live run of the owner, through the cancel path."
    )


class SuspensionRecord(BaseModel):
    """One suspended owner: since when, why and by whom."""

    owner: str
    since: datetime
    reason: str
    by: str = Field(description="Who suspended it: `operator NAME` over the API.")


class SuspendOutcome(SuspensionRecord):
    """The owner's suspension after a suspend, and what the call did."""

    new: bool = Field(description="False when the owner already was suspended (kept as it was).")
    cancelled: int | None = Field(
        description="Live runs this call cancelled; `null` without `cancel_live`."
    )


class ResumeOutcome(BaseModel):
    """What a resume did."""

    owner: str
    resumed: bool = Field(description="False when the owner was not suspended (nothing done).")
    lifted: SuspensionRecord | None = Field(description="The suspension lifted, if any.")


class OwnerEvent(BaseModel):
    """One row of an owner's audit."""

    at: datetime
    kind: str = Field(description="`suspended`, `cancelled_live` or `resumed`.")
    reason: str | None
    by: str
    detail: dict[str, Any] | None = Field(
        description='`{"cancelled": N}` for a cancel of live runs.'
    )


class OwnerSuspension(BaseModel):
    """An owner's suspension now, and its audit, newest first."""

    owner: str
    suspension: SuspensionRecord | None = Field(description="`null`: not suspended now.")
    events: list[OwnerEvent]


def _record(found: suspensions.Suspension | None) -> SuspensionRecord | None:
    return None if found is None else SuspensionRecord.model_validate(found.as_dict())


@router.get("/suspended", summary="The suspended owners")
def listing(operator: ApiOperator, orch: Orch) -> list[SuspensionRecord]:
    """Every suspended owner, by name."""
    return [SuspensionRecord.model_validate(one.as_dict()) for one in orch.suspended_owners()]


@router.post("/{owner}/suspend", status_code=201, summary="Suspend an owner")
def suspend(
    owner: str, body: SuspendRequest, response: Response, operator: ApiOperator, orch: Orch
) -> SuspendOutcome:
    """Nothing new of the owner is admitted (launches, reruns, schedule fires, registrations,
    answers, approvals, new fan-outs, its tokens) until it is resumed: ``201``. An owner
    already suspended keeps its suspension: ``200`` with ``new: false`` (with ``cancel_live``,
    its live runs are cancelled all the same)."""
    done = orch.suspend_owner(
        owner, reason=body.reason, by=f"operator {operator}", cancel_live=body.cancel_live
    )
    if not done.new:
        response.status_code = 200
    return SuspendOutcome(**done.suspension.as_dict(), new=done.new, cancelled=done.cancelled)


@router.post("/{owner}/resume", summary="Resume a suspended owner")
def resume(owner: str, operator: ApiOperator, orch: Orch) -> ResumeOutcome:
    """The owner's launches, schedules and tokens work again; ``200`` with ``resumed: false``
    when it was not suspended (nothing is written)."""
    lifted = orch.resume_owner(owner, by=f"operator {operator}")
    return ResumeOutcome(owner=owner, resumed=lifted is not None, lifted=_record(lifted))


@router.get("/{owner}/suspension", summary="An owner's suspension and audit")
def suspension(
    owner: str,
    operator: ApiOperator,
    orch: Orch,
    last: Annotated[int, Query(ge=1, le=MAX_EVENTS, description="Audit rows.")] = 20,
) -> OwnerSuspension:
    """The owner's suspension now (``null`` when none) and the latest rows of its audit,
    which outlives the suspension."""
    events = [OwnerEvent.model_validate(row) for row in orch.owner_events(owner, last=last)]
    return OwnerSuspension(
        owner=owner, suspension=_record(orch.owner_suspension(owner)), events=events
    )
