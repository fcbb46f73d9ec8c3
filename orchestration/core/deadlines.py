"""``deadline_at``: the latest time by which a live run will be terminal or re-armed.

Computed from the run's own bounds (step timeout, park budget, cancel grace), the heartbeat
timeout and the sweep interval, and stored on the row at every write that moves one of them,
so an operator reads it without computing anything. Time is a parameter.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from orchestration.core.models import Run
from orchestration.core.settings import MARGIN_SECONDS, Settings, lock_release_seconds
from orchestration.core.states import UNATTENDED_PARKS, ParkReason, RunStatus


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def park_expiry(
    settings: Settings,
    park_reason: str | None,
    parked_since: datetime,
    waiting_until: datetime | None,
) -> datetime:
    """When a park runs out: its budget, unless a later ``waiting_until`` overrides it; an
    approval's at its ``expires_in`` (``waiting_until``) exactly."""
    if park_reason == ParkReason.APPROVAL and waiting_until is not None:
        return waiting_until
    expiry = parked_since + _s(settings.park_budget(park_reason))
    if waiting_until is not None and waiting_until > expiry:
        return waiting_until
    return expiry


def heartbeat_expiry(settings: Settings, heartbeat_at: datetime) -> datetime:
    """When a heartbeat stamped at ``heartbeat_at`` is dead."""
    return heartbeat_at + _s(settings.heartbeat_timeout)


def slack_seconds(settings: Settings) -> float:
    """What every deadline adds to the instant its condition becomes true: the sweeper acts
    within one interval, plus a margin for clocks and queues, plus the time a writer frozen on
    the run's own row can hold it before the database aborts its transaction."""
    return (
        settings.sweep_interval + MARGIN_SECONDS + lock_release_seconds(settings.provider_timeout)
    )


def step_timeout_at(started_at: datetime | None, timeout: float) -> datetime | None:
    """When a step attempt started at ``started_at`` times out (``None`` before it starts)."""
    return None if started_at is None else started_at + _s(float(timeout))


def for_run(
    settings: Settings,
    run: Run,
    *,
    heartbeat_at: datetime,
    status: RunStatus | None = None,
    now: datetime | None = None,
) -> datetime:
    """The deadline of ``run`` as its row stands (in ``status``, default its own)."""
    return compute(
        settings,
        status or RunStatus(run.status),
        heartbeat_at=heartbeat_at,
        park_reason=run.park_reason,
        parked_since=run.parked_since,
        waiting_until=run.waiting_until,
        cancel_requested_at=run.cancel_requested_at,
        now=now,
    )


def compute(
    settings: Settings,
    status: RunStatus,
    *,
    heartbeat_at: datetime,
    park_reason: str | None = None,
    parked_since: datetime | None = None,
    waiting_until: datetime | None = None,
    cancel_requested_at: datetime | None = None,
    now: datetime | None = None,
) -> datetime:
    """The deadline for a live run in ``status``, stated at ``now`` (default: the heartbeat).

    Each bound is when the sweeper's condition for that state becomes true; the sweeper acts
    within the slack after it. A condition that is already true counts from ``now``: a
    deadline is never stated in the past (a run re-armed after its step's timeout has gone by
    is closed within the slack, not before it was re-armed).
    """
    return max(
        _condition(
            settings,
            status,
            heartbeat_at,
            park_reason,
            parked_since,
            waiting_until,
            cancel_requested_at,
        ),
        now or heartbeat_at,
    ) + _s(slack_seconds(settings))


def _condition(
    settings: Settings,
    status: RunStatus,
    heartbeat_at: datetime,
    park_reason: str | None,
    parked_since: datetime | None,
    waiting_until: datetime | None,
    cancel_requested_at: datetime | None,
) -> datetime:
    """When the sweeper's condition for a run in ``status`` becomes true."""
    alive_until = heartbeat_expiry(settings, heartbeat_at)
    if status is RunStatus.CANCELLING and cancel_requested_at is not None:
        return max(cancel_requested_at + _s(settings.cancel_grace), alive_until)
    if status is RunStatus.PARKED and parked_since is not None:
        expiry = park_expiry(settings, park_reason, parked_since, waiting_until)
        if park_reason not in UNATTENDED_PARKS:
            # A polled park (engine limit, platform interrupt) still needs a live heartbeat.
            expiry = min(expiry, alive_until)
        return expiry
    # A running run's step times itself out, but only while its worker lives; the sweeper's
    # condition is the dead heartbeat (it has no rule at the step's timeout: a deadline that
    # counted from the timeout, once it had passed, was one the sweeper could not keep).
    return alive_until
