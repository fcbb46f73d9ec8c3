"""``deadline_at``: the latest time by which a live run will be terminal or re-armed.

Computed from the run's own bounds (step timeout, park budget, cancel grace), the heartbeat
timeout and the sweep interval, and stored on the row at every write that moves one of them,
so an operator reads it without computing anything. Time is a parameter.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from orchestration.settings import MARGIN_SECONDS, Settings, lock_release_seconds
from orchestration.states import ParkReason, RunStatus


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def park_expiry(
    settings: Settings,
    park_reason: str | None,
    parked_since: datetime,
    waiting_until: datetime | None,
) -> datetime:
    """When a park runs out: its budget, unless a later ``waiting_until`` overrides it."""
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


def compute(
    settings: Settings,
    status: RunStatus,
    *,
    heartbeat_at: datetime,
    step_timeout_at: datetime | None = None,
    park_reason: str | None = None,
    parked_since: datetime | None = None,
    waiting_until: datetime | None = None,
    cancel_requested_at: datetime | None = None,
) -> datetime:
    """The deadline for a live run in ``status`` (see the module docstring).

    Each bound is when the sweeper's condition for that state becomes true; the sweeper acts
    within one interval after it, plus a margin for clocks and queues.
    """
    slack = _s(slack_seconds(settings))
    alive_until = heartbeat_expiry(settings, heartbeat_at)
    if status is RunStatus.CANCELLING and cancel_requested_at is not None:
        grace_until = cancel_requested_at + _s(settings.cancel_grace)
        return max(grace_until, alive_until) + slack
    if status is RunStatus.PARKED and parked_since is not None:
        expiry = park_expiry(settings, park_reason, parked_since, waiting_until)
        if park_reason != ParkReason.HUMAN:
            # A polled park (engine limit, platform interrupt) still needs a live heartbeat.
            expiry = min(expiry, alive_until)
        return expiry + slack
    if status is RunStatus.RUNNING and step_timeout_at is not None:
        # The step's timeout bounds its turn; effects (``waiting``) are bounded by attempts.
        return min(step_timeout_at, alive_until) + slack
    return alive_until + slack
