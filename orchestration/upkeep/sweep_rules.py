"""The sweeper's rules, in the order it applies them: one table for the sweeper and ``explain``.

For each live run, the first rule that *owns* it decides; the rule acts when it is *due*
(a cancelling run is owned by cancel enforcement, which acts only once the grace is over and
the heartbeat is dead). ``explain`` names the same rule and says what it will do, so the
operator's answer cannot drift from what the sweeper runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from orchestration.core.health import Judged
from orchestration.core.settings import Settings
from orchestration.core.states import UNATTENDED_PARKS, ConcurrencyState, ParkReason, RunStatus


class RunView(Protocol):
    """The columns the rules read (a ``Run`` row, or a ``RunRecord``)."""

    @property
    def status(self) -> str: ...
    @property
    def cancel_requested_at(self) -> datetime | None: ...
    @property
    def deadline_at(self) -> datetime | None: ...
    @property
    def concurrency(self) -> str | None: ...
    @property
    def park_reason(self) -> str | None: ...
    @property
    def rearms(self) -> int: ...


#: Whether a rule owns (or acts on) a run: its row, what the SQL judged of it
#: (:mod:`orchestration.core.health`) and the instant.
Check = Callable[[Settings, RunView, Judged, datetime], bool]


@dataclass(frozen=True)
class Rule:
    """One sweeper rule: the report counter it bumps, which runs it owns, when it acts, and
    what it does, in words."""

    name: str
    owns: Check
    due: Check
    says: Callable[[Settings, RunView], str]


def _always(_: Settings, __: RunView, ___: Judged, ____: datetime) -> bool:
    return True


def _cancelling(_: Settings, run: RunView, __: Judged, ___: datetime) -> bool:
    return run.status == RunStatus.CANCELLING


def _grace_over_and_dead(settings: Settings, run: RunView, judged: Judged, now: datetime) -> bool:
    requested = run.cancel_requested_at
    grace_over = requested is not None and now - requested > timedelta(
        seconds=settings.cancel_grace
    )
    return grace_over and judged.heartbeat_dead


def _queued_behind(_: Settings, run: RunView, __: Judged, ___: datetime) -> bool:
    return run.status == RunStatus.QUEUED and run.concurrency == ConcurrencyState.QUEUED


def _waiting_for_slot(_: Settings, run: RunView, __: Judged, ___: datetime) -> bool:
    return run.status == RunStatus.QUEUED and run.concurrency == ConcurrencyState.SLOT


def _on_branches(_: Settings, run: RunView, judged: Judged, __: datetime) -> bool:
    on = run.status == RunStatus.PARKED and run.park_reason == ParkReason.BRANCHES
    return on and run.cancel_requested_at is None and not judged.park_expired


def _polled_and_dead(_: Settings, run: RunView, judged: Judged, __: datetime) -> bool:
    human = run.status == RunStatus.PARKED and run.park_reason in UNATTENDED_PARKS
    return not human and judged.heartbeat_dead


def _dead_and_spent(settings: Settings, run: RunView, judged: Judged, now: datetime) -> bool:
    dead = _polled_and_dead(settings, run, judged, now)
    return dead and run.rearms >= settings.max_rearms


def _past_deadline(_: Settings, run: RunView, __: Judged, now: datetime) -> bool:
    return run.deadline_at is not None and now > run.deadline_at


RULES: tuple[Rule, ...] = (
    Rule(
        "cancels_enforced",
        _cancelling,
        _grace_over_and_dead,
        lambda s, run: (
            "enforces the cancel (cancel_enforced) once the grace "
            f"({s.cancel_grace:g}s) is over and the heartbeat is dead"
        ),
    ),
    Rule(
        "promoted",
        _queued_behind,
        _always,
        lambda s, run: (
            "gives it the key once the holder is gone, and refreshes its deadline meanwhile"
        ),
    ),
    Rule(
        "branches_admitted",
        _waiting_for_slot,
        _always,
        lambda s, run: (
            "admits it once its step has a free slot (max_concurrency); its parent's end ends it"
        ),
    ),
    Rule(
        "branches_settled",
        _on_branches,
        _always,
        lambda s, run: (
            "settles its branching step: admits waiting branches into free slots, and joins "
            "the step once every branch has ended (a hand-off lost with its process)"
        ),
    ),
    Rule(
        "approvals_expired",
        lambda s, run, judged, now: judged.approval_expired,
        _always,
        lambda s, run: "applies the approval step's on_expiry (its expires_in is up)",
    ),
    Rule(
        "parks_expired",
        lambda s, run, judged, now: judged.park_expired,
        _always,
        lambda s, run: "closes it timed_out (park_expired)",
    ),
    Rule(
        "interrupted",
        _dead_and_spent,
        _always,
        lambda s, run: "closes it interrupted (heartbeat_lost): re-arms are used up",
    ),
    Rule(
        "rearmed",
        _polled_and_dead,
        _always,
        lambda s, run: (
            f"re-arms it ({run.rearms}/{s.max_rearms} re-arms used; then it is closed interrupted)"
        ),
    ),
    Rule(
        "deadlines_exceeded",
        _past_deadline,
        _always,
        lambda s, run: (
            "closes it timed_out (deadline_exceeded): it passed its deadline_at "
            "and nothing had ended it"
        ),
    ),
)


def owner(settings: Settings, run: RunView, judged: Judged, now: datetime) -> Rule | None:
    """The first rule that owns ``run`` at ``now`` (``None``: the sweeper leaves it alone)."""
    for rule in RULES:
        if rule.owns(settings, run, judged, now):
            return rule
    return None


def acts(settings: Settings, run: RunView, judged: Judged, now: datetime) -> bool:
    """Whether the sweeper acts on ``run`` at ``now``: its owning rule is due. Runs it
    leaves alone take no owner's share of a pass."""
    rule = owner(settings, run, judged, now)
    return rule is not None and rule.due(settings, run, judged, now)
