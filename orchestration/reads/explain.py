"""``explain``: why a run is where it is, what moves it next, and by when it ends.

Plain words from the run record and the clock, so an operator never reads rows to know
whether a run is stuck. What moves a run next is a worker or the sweeper; the caller says
whether each is there (:class:`Around`), and ``explain`` never promises one that is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orchestration.core.deadlines import heartbeat_expiry, park_expiry
from orchestration.core.health import Judged
from orchestration.core.settings import MARGIN_SECONDS, Settings
from orchestration.core.states import (
    RUN_TERMINAL,
    ConcurrencyState,
    Health,
    ParkReason,
    RunStatus,
    StepStatus,
    TurnStopStatus,
)
from orchestration.execution import turn_budget
from orchestration.reads.records import RunRecord, StepRecord
from orchestration.upkeep import sweep_rules
from orchestration.workflows.steps import StepSpec


def _nobody() -> str | None:
    return None


@dataclass(frozen=True)
class Around:
    """What runs beside the database, as the caller found it. ``sweeper``: why no sweeper
    pass can be counted on (``None``: it passes on time). ``workers``: asked only when the
    next move waits for a worker, why none can be counted on (``None``: a worker consuming
    the run queue answered). ``upkeep``: asked only of a live run whose sweeper passes on
    time, why no worker may run the next pass (``None``: a worker consuming the upkeep
    queue answered)."""

    sweeper: str | None = None
    workers: Callable[[], str | None] = field(default=_nobody)
    upkeep: Callable[[], str | None] = field(default=_nobody)


#: Run statuses whose next move is a worker's (unless the run is stalled: then the sweeper's).
_WORKER_STATUSES = frozenset(
    {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.CANCELLING}
)
#: Parks that end by a poll (a worker's), not by a person.
_POLLED_PARKS = frozenset({ParkReason.ENGINE_LIMIT, ParkReason.PLATFORM_INTERRUPT})


def _waits_for_sweeper(record: RunRecord, status: RunStatus) -> bool:
    """Whether the next move is the sweeper's: a stalled run's re-arm, a park's expiry, a
    cancel's enforcement, a queued run's promotion or admission."""
    return (
        record.health == Health.STALLED
        or status in (RunStatus.PARKED, RunStatus.CANCELLING)
        or (
            status is RunStatus.QUEUED
            and record.concurrency in (ConcurrencyState.QUEUED, ConcurrencyState.SLOT)
        )
    )


def _waits_for_worker(record: RunRecord, status: RunStatus) -> bool:
    """Whether the next move is a worker's: a step task to pick up, a poll, a retry, an
    effect, a step that honours a cancel."""
    if record.health == Health.STALLED:
        return False
    if status is RunStatus.QUEUED:
        return record.concurrency not in (ConcurrencyState.QUEUED, ConcurrencyState.SLOT)
    if status is RunStatus.PARKED:
        return record.park_reason in _POLLED_PARKS
    return status in _WORKER_STATUSES


def _held_for_turns(step: StepRecord) -> bool:
    """The step's start is held by its owner's live-turn budget
    (:mod:`orchestration.execution.turn_budget` writes the words it checks)."""
    return (
        step.status in (StepStatus.PENDING, StepStatus.RETRYING)
        and step.provider_run_id is None
        and step.last_provider_status == turn_budget.WAITING
    )


def _ago(now: datetime, then: datetime | None) -> str:
    if then is None:
        return "never"
    seconds = (now - then).total_seconds()
    return f"{seconds:.0f}s ago" if seconds >= 0 else f"in {-seconds:.0f}s"


def _at(when: datetime | None) -> str:
    return when.isoformat(timespec="seconds") if when else "none"


def _current(record: RunRecord) -> StepRecord | None:
    if 0 <= record.current_step < len(record.steps):
        return record.steps[record.current_step]
    return None


def _next_poll(settings: Settings, due: datetime | None, now: datetime) -> str:
    """The next poll, said truthfully: one due in the past is overdue, and what it waits
    for is a worker (with none up, an answered or re-armed run waits here)."""
    if due is None:
        return "a worker picks up the step task"
    if now - due <= timedelta(seconds=MARGIN_SECONDS):
        return f"the next poll at {_at(due)}"
    return (
        f"the next poll, overdue since {_at(due)} ({_ago(now, due)}): it waits for a worker "
        f"consuming queue {settings.queue!r}"
    )


def _stalled(
    settings: Settings, record: RunRecord, judged: Judged, why: str, now: datetime
) -> tuple[str, str]:
    """Why a stalled run is stalled, and what the sweeper rule that owns it will do (the
    rule table the sweeper itself runs, on what the SQL judged of the run)."""
    sweeper = f"the sweeper (every {settings.sweep_interval:g}s)"
    rule = sweep_rules.owner(settings, record, judged, now)
    move = f"{sweeper} {rule.says(settings, record)}" if rule else f"{sweeper} leaves it alone"
    if rule is not None and rule.name == "parks_expired" and record.parked_since is not None:
        expiry = park_expiry(
            settings, record.park_reason, record.parked_since, record.waiting_until
        )
        return f"{why}; STALLED: the park expired at {_at(expiry)}", move
    beat = record.heartbeat_at or record.created_at
    why = (
        f"{why}; STALLED: no heartbeat since {_at(beat)} (dead since "
        + _at(heartbeat_expiry(settings, beat))
        + ")"
    )
    return why, move


def _spec(record: RunRecord, step: StepRecord) -> StepSpec:
    """The step as the run's stored workflow states it."""
    return StepSpec.model_validate(record.workflow["steps"][step.index])


def _retrying(
    settings: Settings, record: RunRecord, step: StepRecord, now: datetime
) -> tuple[str, str]:
    """A step between two attempts: what ended the last one, when the next starts, and the
    latest the step can end with every attempt left (parks aside: each has its budget)."""
    spec = _spec(record, step)
    assert spec.retry is not None
    ended = step.past_attempts[-1] if step.past_attempts else {}
    why = (
        f"step {step.step_id!r} ended attempt {step.attempt - 1} of {spec.retry.attempts} "
        f"({ended.get('reason')}: {ended.get('error')})"
    )
    stop = step.turn_stop or {}
    waits = (
        f" once attempt {step.attempt - 1}'s turn is stopped (its stop is pending)"
        if stop.get("status") == TurnStopStatus.PENDING and stop.get("key") != step.idempotency_key
        else ""
    )
    start = max(step.retry_at or now, now)
    latest = start + timedelta(
        seconds=spec.timeout
        + spec.retry.rest(step.attempt, spec.timeout, settings.max_retry_backoff)
    )
    return why, (
        f"attempt {step.attempt} starts at {_at(step.retry_at)}{waits}; with every attempt "
        f"left the step ends by {_at(latest)}"
    )


def _branches(record: RunRecord, step: StepRecord, expiry: datetime) -> tuple[str, str]:
    """A step parked on its branches: how far they are, which one holds it, and its bound."""
    spec = _spec(record, step)
    branches = step.branches or []
    ended = [b for b in branches if b["status"] in RUN_TERMINAL]
    live = [b for b in branches if b["status"] not in RUN_TERMINAL]
    failed = sum(1 for b in ended if b["status"] != RunStatus.COMPLETED)
    why = f", waiting for its branches: {len(ended)} of {len(branches)} branches ended"
    why += f" ({failed} did not complete)" if failed else ""
    if live:
        first = live[0]
        why += f"; branch {first['id']} (run {first['run_id']}, {first['status']}) holds it"
    else:
        why += "; the join is due"
    move = (
        f"each branch's end settles the step (join: {spec.branch_join.value}); "
        f"at {_at(expiry)} the park expires, the run times out and every branch is cancelled"
    )
    return why, move


def explain(
    settings: Settings,
    record: RunRecord,
    judged: Judged,
    now: datetime,
    around: Around | None = None,
    *,
    suspension: str | None = None,
) -> dict[str, Any]:
    """A structured explanation of ``record`` and what the SQL ``judged`` of it at ``now``
    (:func:`orchestration.core.health.judge`); ``text`` joins it into sentences. With ``around``,
    a next move that waits for a sweeper or a worker that is not there says so, and what to
    start. ``suspension``: what the owner's suspension did or does to the run
    (``limits.suspensions.note``), said after why."""
    status = RunStatus(record.status)
    step = _current(record)
    where = f"step {step.step_id!r} ({step.status}, attempt {step.attempt})" if step else "no step"
    if record.parent_run_id is not None:
        where = f"branch {record.branch_key} of run {record.parent_run_id}: {where}"
    why: str
    next_move: str
    if record.health == Health.ENDED:
        why = f"it ended {_ago(now, record.finished_at)}: {record.stop_reason}" + (
            f" ({record.error})" if record.error else ""
        )
        next_move = "nothing: terminal is final"
    elif status is RunStatus.PARKED and record.parked_since is not None:
        expiry = park_expiry(
            settings, record.park_reason, record.parked_since, record.waiting_until
        )
        why = f"{where} is parked ({record.park_reason}) since {_at(record.parked_since)}"
        if record.park_reason == ParkReason.HUMAN:
            prompt = step.prompt if step else None
            why += f", waiting for a human answer to {prompt!r}"
            next_move = (
                f"`orchestration answer {record.id} --step {step.step_id if step else '?'} "
                f"--value JSON`, or the park expires at {_at(expiry)} and the run times out"
            )
        elif record.park_reason == ParkReason.APPROVAL and step is not None:
            spec = _spec(record, step)
            on_expiry = spec.approval.on_expiry.value if spec.approval else "reject"
            why += f", waiting for a decision on {step.prompt!r}"
            next_move = (
                f"`orchestration approve {record.id} --step {step.step_id} [--reject]`, or at "
                f"{_at(expiry)} the sweeper applies on_expiry ({on_expiry})"
            )
        elif record.park_reason == ParkReason.BRANCHES and step is not None:
            more, next_move = _branches(record, step, expiry)
            why += more
        elif record.park_reason == ParkReason.ENGINE_LIMIT:
            why += f", rate limited until {_at(record.waiting_until)}"
            next_move = f"the next poll after the limit resets; the park expires at {_at(expiry)}"
        else:
            why += ", the provider or the worker was unreachable"
            next_move = f"the next poll (retrying); the park expires at {_at(expiry)}"
    elif status is RunStatus.CANCELLING:
        grace = (record.cancel_requested_at or now) + timedelta(seconds=settings.cancel_grace)
        why = f"a cancel was requested {_ago(now, record.cancel_requested_at)}"
        next_move = (
            f"the step honours it at its next execution; otherwise the sweeper enforces it "
            f"once the grace ends ({_at(grace)}) and the heartbeat is dead"
        )
    elif status is RunStatus.QUEUED and record.concurrency == ConcurrencyState.QUEUED:
        why = f"it waits for concurrency key {record.concurrency_key!r}, held by another run"
        next_move = "it starts when the holder ends (any terminal path, or the sweeper)"
    elif status is RunStatus.QUEUED and record.concurrency == ConcurrencyState.SLOT:
        why = f"{where} waits for a slot of its step's max_concurrency"
        next_move = (
            "it starts when a sibling branch ends (or the sweeper admits it); its parent's "
            "end ends it"
        )
    elif status is RunStatus.WAITING:
        why = f"{where} finished its turn; its post-step effects are running"
        next_move = "the next effect attempt (bounded attempts with backoff)"
    elif step is not None and _held_for_turns(step):
        why = (
            f"{where} waits for one of its owner's live provider turns to end: the owner is "
            "at its budget (ORCH_MAX_LIVE_TURNS_PER_OWNER, or its own --max-live-turns)"
        )
        next_move = (
            "the step task looks again on a countdown and starts once a turn ends; past "
            f"ORCH_MAX_LIVE_TURN_WAIT ({settings.max_live_turn_wait:g} s) the run fails over_limit"
        )
    elif status is RunStatus.QUEUED:
        why = "its first step has not started yet (waiting for a worker)"
        next_move = "a worker picks up the step task"
    elif step is not None and step.status == StepStatus.RETRYING:
        why, next_move = _retrying(settings, record, step, now)
    else:
        last = step.last_provider_status if step else None
        why = f"{where} is polling its provider turn (last status {last!r})"
        next_move = _next_poll(settings, step.next_poll_at if step else None, now)
    if record.health == Health.STALLED:
        why, next_move = _stalled(settings, record, judged, why, now)
    if suspension is not None:
        why += f"; {suspension}"
    live = record.health != Health.ENDED
    sweeper = (around.sweeper or around.upkeep()) if around is not None and live else None
    if around is not None and live:
        missing = [sweeper] if sweeper and _waits_for_sweeper(record, status) else []
        if _waits_for_worker(record, status) and (workers := around.workers()) is not None:
            missing.append(workers)
        if missing:
            next_move += "; but " + "; and ".join(missing)
    summary: dict[str, Any] = {
        "run_id": record.id,
        "status": record.status,
        "health": record.health,
        "stop_reason": record.stop_reason,
        "why": why,
        "next": next_move,
        "deadline_at": record.deadline_at,
        "heartbeat_at": record.heartbeat_at,
        "needs_review": record.needs_review,
    }
    if record.deadline_at is None:
        ends = "It has no deadline: it is terminal."
    elif sweeper is not None:
        ends = f"Its deadline_at is {_at(record.deadline_at)}, which only the sweeper enforces"
        ends += "." if _waits_for_sweeper(record, status) else f", but {sweeper}."
    else:
        ends = f"It will be terminal or re-armed by {_at(record.deadline_at)}."
    summary["text"] = (
        f"Run {record.id} is {record.status} (health: {record.health}) because {why}. "
        f"Next: {next_move}. {ends}" + (" Flagged for review." if record.needs_review else "")
    )
    ran_on = {step.step_id: step.evidence for step in record.steps if step.evidence}
    if ran_on:
        summary["ran_on"] = ran_on
        said = "; ".join(f"step {step!r} {ran_on_text(seen)}" for step, seen in ran_on.items())
        summary["text"] += f" Agents: {said}."
    return summary


def ran_on_text(seen: dict[str, Any]) -> str:
    """A step's evidence in words: what its agent said at launch and at the turn's start."""
    parts = []
    for moment in ("launch", "start"):
        one = seen.get(moment)
        if not isinstance(one, dict):
            continue
        if "error" in one:
            parts.append(f"at {moment} could not say ({one['error']})")
            continue
        detail = ", ".join(f"{key} {value}" for key, value in (one.get("detail") or {}).items())
        version = one.get("version") or "no version"
        parts.append(
            f"at {moment} ran on {one.get('name')!r} {version}" + (f" ({detail})" if detail else "")
        )
    return ", ".join(parts) or "said nothing"
