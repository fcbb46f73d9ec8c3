"""Run and step statuses, stop reasons, park reasons and the allowed transitions.

This module is data only: no I/O. The database enforces these tables itself: triggers
generated from them (:mod:`orchestration.core.status_triggers`) refuse an illegal status change
or a new row in a status it cannot start in, and write the journal row of every change, so
no writer, fast path or not, can step around them. ``docs/concepts.md`` is checked against
this module by ``tests/unit/test_states.py``.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is. The first five are live, the last five are terminal and final."""

    #: Written durably by ``launch``; no step has started its provider turn yet.
    QUEUED = "queued"
    #: A step is starting or polling its provider turn.
    RUNNING = "running"
    #: A step's turn finished; its post-step effects (checkpoint, webhook) are running.
    WAITING = "waiting"
    #: A step is parked (human input, an engine limit, a platform interruption) within a budget.
    PARKED = "parked"
    #: A cancel was requested; the run is being stopped.
    CANCELLING = "cancelling"
    #: Every step finished; ``result`` holds the last step's output.
    COMPLETED = "completed"
    #: A step or an effect failed; ``error`` says which and why.
    FAILED = "failed"
    #: Cancelled by a caller, by a preempting run, or by the sweeper enforcing a cancel.
    CANCELLED = "cancelled"
    #: A step timeout, a park budget or the run deadline ran out.
    TIMED_OUT = "timed_out"
    #: The engine lost the run (dead heartbeat past its re-arms) or a claim displaced it.
    INTERRUPTED = "interrupted"


class StepStatus(StrEnum):
    """Where a step is."""

    #: Not started.
    PENDING = "pending"
    #: Its provider turn is being started, polled, or its effects are running.
    RUNNING = "running"
    #: Its turn waits for a human answer, an engine limit reset or a platform to come back.
    PARKED = "parked"
    #: An attempt ended in a way its ``retry`` lists; the next attempt starts at ``retry_at``.
    RETRYING = "retrying"
    #: Its turn finished and its effects ran (or failed under the ``continue`` policy).
    COMPLETED = "completed"
    #: Its turn or a required effect failed.
    FAILED = "failed"
    #: The run was cancelled while this step was unfinished.
    CANCELLED = "cancelled"
    #: Its timeout or park budget ran out.
    TIMED_OUT = "timed_out"
    #: The run ended before this step started.
    SKIPPED = "skipped"


class StopReason(StrEnum):
    """Why a run is terminal: a closed set, one per cause."""

    #: Every step finished.
    COMPLETED = "completed"
    #: A step's provider turn failed, or its input could not be rendered.
    STEP_FAILED = "step_failed"
    #: A post-step effect exhausted its attempts under the ``fail`` policy.
    EFFECT_FAILED = "effect_failed"
    #: A caller cancelled the run and the cancel landed.
    CANCEL_REQUESTED = "cancel_requested"
    #: A cancel request went unhonoured past ``ORCH_CANCEL_GRACE`` with a dead heartbeat; the
    #: sweeper closed the run.
    CANCEL_ENFORCED = "cancel_enforced"
    #: A newer run on the same concurrency key (``on_conflict=interrupt``) cancelled this one.
    PREEMPTED = "preempted"
    #: A step ran past its ``timeout``.
    STEP_TIMEOUT = "step_timeout"
    #: A park outlived its budget (and any ``waiting_until``).
    PARK_EXPIRED = "park_expired"
    #: The run passed its ``deadline_at`` with nothing able to move it.
    DEADLINE_EXCEEDED = "deadline_exceeded"
    #: The heartbeat stayed dead after ``ORCH_MAX_REARMS`` re-arms.
    HEARTBEAT_LOST = "heartbeat_lost"
    #: Another run took over this run's concurrency claim from a dead holder; flagged for review.
    DISPLACED = "displaced"
    #: A value a tenant controls or a provider returned did not fit its bound (the error
    #: names the ``ORCH_`` setting); the database never sees it.
    OVER_LIMIT = "over_limit"
    #: A person rejected an approval step (or it expired with ``on_expiry: reject``).
    APPROVAL_REJECTED = "approval_rejected"
    #: An approval step expired undecided with ``on_expiry: fail``.
    APPROVAL_EXPIRED = "approval_expired"
    #: A branch run whose parent ended first (cancelled, timed out, or failed because a
    #: sibling branch failed under ``join: all``).
    PARENT_ENDED = "parent_ended"
    #: A pinned step's agent stated another version at the step's start than at launch.
    AGENT_CHANGED = "agent_changed"


class ParkReason(StrEnum):
    """Why a run is parked; each reason has its own budget (``ORCH_PARK_BUDGET_*``)."""

    #: The provider asked for input (``input_required``); ``answer`` resumes it.
    HUMAN = "human"
    #: The provider is rate limited until ``waiting_until``.
    ENGINE_LIMIT = "engine_limit"
    #: The provider or the worker is unreachable; polling resumes when it is back.
    PLATFORM_INTERRUPT = "platform_interrupt"
    #: An approval step waits for a person's decision until its ``expires_in``.
    APPROVAL = "approval"
    #: A ``for_each`` or ``parallel`` step waits for its branch runs to settle.
    BRANCHES = "branches"


#: Parks that no worker polls (a person, or the branch runs, end them), so their heartbeat is
#: not expected.
UNATTENDED_PARKS: frozenset[str] = frozenset(
    {ParkReason.HUMAN.value, ParkReason.APPROVAL.value, ParkReason.BRANCHES.value}
)


class Join(StrEnum):
    """When a branching step is done with its branches."""

    #: Every branch completed; the first that does not fails the step and cancels the others.
    ALL = "all"
    #: Every branch ended; then the step fails if any of them did not complete.
    ALL_SETTLED = "all_settled"


class RetryOn(StrEnum):
    """What ends an attempt that a step's ``retry`` may start again (its ``on`` list)."""

    #: The provider ended the turn ``failed``.
    FAILED = "failed"
    #: The provider said the turn is rate limited (instead of parking for the reset).
    RATE_LIMITED = "rate_limited"
    #: The provider could not be reached (instead of parking until it is back).
    PLATFORM_INTERRUPT = "platform_interrupt"


class Health(StrEnum):
    """A run's health, derived in :mod:`orchestration.core.health` from its row and the clock."""

    #: Live and moving: its heartbeat is fresh.
    WORKING = "working"
    #: Parked within its budget.
    WAITING = "waiting"
    #: Live but nothing is moving it: a dead heartbeat or a park past its budget.
    STALLED = "stalled"
    #: Terminal.
    ENDED = "ended"


class EffectStatus(StrEnum):
    """Where a post-step effect in the outbox is."""

    #: Due at ``next_attempt_at``.
    PENDING = "pending"
    #: Ran successfully.
    DONE = "done"
    #: Exhausted its attempts.
    EXHAUSTED = "exhausted"


class ConcurrencyState(StrEnum):
    """Where a run stands on a shared bound, its concurrency key or its parent step's
    ``max_concurrency`` (``runs.concurrency``; ``NULL`` without one, or once the run has ended)."""

    #: The one active run of (owner, key), enforced by a unique partial index.
    HOLDING = "holding"
    #: Waiting for the holder to end; started by the holder's end or the sweeper.
    QUEUED = "queued"
    #: A branch run waiting for a slot of its step's ``max_concurrency``; admitted by a
    #: sibling's end or the sweeper.
    SLOT = "slot"


class TurnStopStatus(StrEnum):
    """Where the provider cancel of an ended step's turn is (``steps.turn_stop``)."""

    #: Asked for; the ``stop_turn`` task carries it out, bounded and retried.
    PENDING = "pending"
    #: The provider accepted the cancel (or the turn had already finished).
    STOPPED = "stopped"
    #: The provider refused, or every attempt failed; the error is recorded beside it.
    FAILED = "failed"


RUN_TERMINAL: frozenset[RunStatus] = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.TIMED_OUT,
        RunStatus.INTERRUPTED,
    }
)
RUN_LIVE: frozenset[RunStatus] = frozenset(set(RunStatus) - RUN_TERMINAL)

STEP_TERMINAL: frozenset[StepStatus] = frozenset(
    {
        StepStatus.COMPLETED,
        StepStatus.FAILED,
        StepStatus.CANCELLED,
        StepStatus.TIMED_OUT,
        StepStatus.SKIPPED,
    }
)
STEP_LIVE: frozenset[StepStatus] = frozenset(set(StepStatus) - STEP_TERMINAL)

_R = RunStatus
#: For each run status, the statuses it may move to. Terminal statuses have none.
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    _R.QUEUED: frozenset(
        {_R.RUNNING, _R.CANCELLING, _R.CANCELLED, _R.FAILED, _R.TIMED_OUT, _R.INTERRUPTED}
    ),
    _R.RUNNING: frozenset(
        {
            _R.WAITING,
            _R.PARKED,
            _R.CANCELLING,
            _R.COMPLETED,
            _R.FAILED,
            _R.CANCELLED,
            _R.TIMED_OUT,
            _R.INTERRUPTED,
        }
    ),
    _R.WAITING: frozenset(
        {
            _R.RUNNING,
            _R.CANCELLING,
            _R.COMPLETED,
            _R.FAILED,
            _R.CANCELLED,
            _R.TIMED_OUT,
            _R.INTERRUPTED,
        }
    ),
    _R.PARKED: frozenset(
        {_R.RUNNING, _R.CANCELLING, _R.CANCELLED, _R.FAILED, _R.TIMED_OUT, _R.INTERRUPTED}
    ),
    _R.CANCELLING: frozenset({_R.CANCELLED, _R.TIMED_OUT, _R.INTERRUPTED}),
    **{status: frozenset() for status in RUN_TERMINAL},
}

_S = StepStatus
#: For each step status, the statuses it may move to. Terminal statuses have none.
STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    _S.PENDING: frozenset({_S.RUNNING, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT, _S.SKIPPED}),
    _S.RUNNING: frozenset(
        {_S.PARKED, _S.RETRYING, _S.COMPLETED, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT}
    ),
    _S.PARKED: frozenset({_S.RUNNING, _S.RETRYING, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT}),
    _S.RETRYING: frozenset({_S.RUNNING, _S.FAILED, _S.CANCELLED, _S.TIMED_OUT}),
    **{status: frozenset() for status in STEP_TERMINAL},
}

#: Which stop reasons may accompany which terminal run status.
STOP_REASONS: dict[RunStatus, frozenset[StopReason]] = {
    _R.COMPLETED: frozenset({StopReason.COMPLETED}),
    _R.FAILED: frozenset(
        {
            StopReason.STEP_FAILED,
            StopReason.EFFECT_FAILED,
            StopReason.OVER_LIMIT,
            StopReason.APPROVAL_REJECTED,
            StopReason.APPROVAL_EXPIRED,
            StopReason.AGENT_CHANGED,
        }
    ),
    _R.CANCELLED: frozenset(
        {
            StopReason.CANCEL_REQUESTED,
            StopReason.CANCEL_ENFORCED,
            StopReason.PREEMPTED,
            StopReason.PARENT_ENDED,
        }
    ),
    _R.TIMED_OUT: frozenset(
        {StopReason.STEP_TIMEOUT, StopReason.PARK_EXPIRED, StopReason.DEADLINE_EXCEEDED}
    ),
    _R.INTERRUPTED: frozenset({StopReason.HEARTBEAT_LOST, StopReason.DISPLACED}),
}

#: The step status that matches a terminal run status, for the run's unfinished steps.
STEP_END_FOR_RUN_END: dict[RunStatus, StepStatus] = {
    _R.COMPLETED: StepStatus.SKIPPED,
    _R.FAILED: StepStatus.FAILED,
    _R.CANCELLED: StepStatus.CANCELLED,
    _R.TIMED_OUT: StepStatus.TIMED_OUT,
    _R.INTERRUPTED: StepStatus.CANCELLED,
}


#: The statuses a new run row may be written in: a launch's run is queued; a branch run whose
#: whole output a rerun reuses is written completed.
RUN_INITIAL: frozenset[RunStatus] = frozenset({RunStatus.QUEUED, RunStatus.COMPLETED})
#: The statuses a new step row may be written in: pending, or completed with the output a
#: rerun reuses.
STEP_INITIAL: frozenset[StepStatus] = frozenset({StepStatus.PENDING, StepStatus.COMPLETED})
#: A new step in this status is not journaled on its own: its run's first journal row says
#: that it was launched.
STEP_SILENT_INITIAL = StepStatus.PENDING


def run_sources(target: RunStatus) -> frozenset[RunStatus]:
    """The run statuses from which ``target`` may be reached."""
    return frozenset(src for src, dests in RUN_TRANSITIONS.items() if target in dests)


def step_sources(target: StepStatus) -> frozenset[StepStatus]:
    """The step statuses from which ``target`` may be reached."""
    return frozenset(src for src, dests in STEP_TRANSITIONS.items() if target in dests)
