"""A run's health, derived in one place from its row and the clock.

``working``: live and its heartbeat is fresh. ``waiting``: parked within its budget (a polled
park also needs a fresh heartbeat: a park never hides a dead run). ``stalled``: a dead
heartbeat or a park past its budget. ``ended``: terminal.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from orchestration.deadlines import heartbeat_expiry, park_expiry
from orchestration.settings import Settings
from orchestration.states import (
    RUN_TERMINAL,
    UNATTENDED_PARKS,
    ClaimState,
    Health,
    ParkReason,
    RunStatus,
)


class RunView(Protocol):
    """The columns health and the sweeper's rules read (a ``Run`` row, or a ``RunRecord``)."""

    @property
    def status(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def heartbeat_at(self) -> datetime | None: ...
    @property
    def cancel_requested_at(self) -> datetime | None: ...
    @property
    def deadline_at(self) -> datetime | None: ...
    @property
    def claim(self) -> str | None: ...
    @property
    def park_reason(self) -> str | None: ...
    @property
    def parked_since(self) -> datetime | None: ...
    @property
    def waiting_until(self) -> datetime | None: ...
    @property
    def rearms(self) -> int: ...


def heartbeat_dead(settings: Settings, run: RunView, now: datetime) -> bool:
    """True when the run's last stamp is older than ``ORCH_HEARTBEAT_TIMEOUT``."""
    stamp = run.heartbeat_at or run.created_at
    return now > heartbeat_expiry(settings, stamp)


def approval_expired(run: RunView, now: datetime) -> bool:
    """True when the run waits on an approval whose ``expires_in`` is up."""
    return (
        run.status == RunStatus.PARKED
        and run.park_reason == ParkReason.APPROVAL
        and run.cancel_requested_at is None
        and run.waiting_until is not None
        and now >= run.waiting_until
    )


def park_expired(settings: Settings, run: RunView, now: datetime) -> bool:
    """True when a parked run is past its budget and any ``waiting_until``."""
    if run.status != RunStatus.PARKED or run.parked_since is None:
        return False
    return now > park_expiry(settings, run.park_reason, run.parked_since, run.waiting_until)


def derive(settings: Settings, run: RunView, now: datetime) -> Health:
    """The health of ``run`` at ``now``."""
    status = RunStatus(run.status)
    if status in RUN_TERMINAL:
        return Health.ENDED
    if status is RunStatus.PARKED:
        if park_expired(settings, run, now):
            return Health.STALLED
        if run.park_reason not in UNATTENDED_PARKS and heartbeat_dead(settings, run, now):
            return Health.STALLED
        return Health.WAITING
    if status is RunStatus.QUEUED and run.claim in (ClaimState.QUEUED, ClaimState.SLOT):
        # Waiting behind the holder of its concurrency key, or for a slot of its parent step's
        # max_concurrency; it is moved when the holder (a sibling branch) ends.
        return Health.WAITING
    return Health.STALLED if heartbeat_dead(settings, run, now) else Health.WORKING
