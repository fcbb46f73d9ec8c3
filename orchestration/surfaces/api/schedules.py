"""``/schedules``: the caller's workflow schedules, and pausing and resuming one by name.

A schedule is the ``schedule:`` of the latest registered version of one of the caller's
definitions (``POST /workflows``); the beat fires it. Another owner's schedule is refused
exactly like a missing one (``400 validation_error``, field ``name``), and an operator's token
gets ``403``: schedules belong to their owner.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from orchestration.surfaces.api.auth import ApiOwner, Orch

router = APIRouter(prefix="/schedules", tags=["schedules"])


class ScheduleState(BaseModel):
    """A schedule after a pause or a resume."""

    name: str
    paused: bool = Field(description="Whether it is paused now.")
    changed: bool = Field(description="False when it already was (the call is idempotent).")


@router.get("", summary="List schedules")
def list_schedules(owner: ApiOwner, orch: Orch) -> list[dict[str, Any]]:
    """The caller's schedules by name: ``ref``, ``schedule``, ``paused`` (and ``paused_at``),
    the next three ``next_fires`` and the latest five ``last_fires`` with the run each made
    (``run_status`` null once the run was pruned) or why it was skipped; times in ISO 8601."""
    return orch.schedules(owner=owner)


@router.post("/{name}/pause", summary="Pause a schedule")
def pause(name: str, owner: ApiOwner, orch: Orch) -> ScheduleState:
    """Its fires are neither recorded nor launched until it is resumed; ``400``
    ``validation_error`` (field ``name``) when the caller has no such schedule."""
    return ScheduleState(name=name, paused=True, changed=orch.pause_schedule(name, owner=owner))


@router.post("/{name}/resume", summary="Resume a schedule")
def resume(name: str, owner: ApiOwner, orch: Orch) -> ScheduleState:
    """The fires missed while it was paused follow the catch-up rule at the next pass (inside
    ``catchup_window``: launched; older: recorded ``skipped``); ``400`` as for a pause."""
    changed = orch.resume_schedule(name, owner=owner)
    return ScheduleState(name=name, paused=False, changed=changed)
