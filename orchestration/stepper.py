"""One execution of a step task: read the database, act once, say what Celery does next.

Every execution begins with a *fence*: ``UPDATE steps SET polls = tick + 1 WHERE polls = tick``.
The tick travels in the message, so of two deliveries of the same message (acks_late,
visibility-timeout redelivery, a re-arm racing a late original) exactly one proceeds and the
other halts without writing. The execution then stamps the heartbeat and runs one phase:

* start: claim and start the provider turn under the run row's lock (see ``cancellation``);
* poll: observe the turn, and finish, fail, park, time out or poll again;
* effects: run the due post-step effects, then complete the step.

The outcome tells the task body what to do: :class:`Poll` (``self.retry(countdown=…)`` with
the next tick), :class:`Proceed` (return, so the chain sends the next step) or :class:`Halt`
(stop the chain: the run is terminal, parked for a human, or this delivery is a duplicate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from orchestration import (
    bounds,
    cancellation,
    deadlines,
    effects,
    health,
    providers,
    templating,
    turns,
)
from orchestration.closing import close_run
from orchestration.db import session_scope, utcnow
from orchestration.dispatch import Dispatcher
from orchestration.errors import (
    LimitExceeded,
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.launching import step_timeout_at
from orchestration.models import Run, Step
from orchestration.providers.base import (
    FINISHED,
    ProviderStatus,
    TurnRef,
    TurnRequest,
    TurnStatus,
)
from orchestration.settings import Settings
from orchestration.states import (
    RUN_TERMINAL,
    STEP_LIVE,
    STEP_TERMINAL,
    ParkReason,
    RunStatus,
    StepStatus,
    StopReason,
)
from orchestration.transitions import touch_run, touch_step, transition_run, transition_step
from orchestration.workflows import StepSpec


@dataclass(frozen=True)
class Poll:
    """Run this step again after ``countdown`` seconds, carrying ``tick``."""

    countdown: float
    tick: int


@dataclass(frozen=True)
class Proceed:
    """The step is finished; the chain goes on."""


@dataclass(frozen=True)
class Halt:
    """Stop here and stop the chain."""

    reason: str


Outcome = Poll | Proceed | Halt

_STARTABLE = [RunStatus.QUEUED.value, RunStatus.RUNNING.value, RunStatus.PARKED.value]
_MOVABLE = [*_STARTABLE, RunStatus.WAITING.value]


class _Cancelled(Exception):
    """The run row refused a write because a cancel is requested (or it ended)."""


class Stepper:
    """Advances runs' steps; one instance per worker process."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher | None,
        *,
        clock: Callable[[], datetime] = utcnow,
        worker: str | None = None,
        pid: int | None = None,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.clock = clock
        self.worker = worker
        self.pid = pid
        #: The tick this process's current execution fenced (``None`` before the fence): a
        #: task that retries after a database error carries it, so it still owns the step.
        self.fenced_tick: int | None = None

    # -- entry -----------------------------------------------------------------------------
    def advance(self, run_id: str, index: int, tick: int) -> Outcome:
        """One execution of step ``index`` of ``run_id`` holding fencing token ``tick``."""
        self.fenced_tick = None
        now = self.clock()
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, run_id)
            if run is None:
                return Halt("no such run")
            if run.status in RUN_TERMINAL:
                return Halt(f"run is {run.status}")
            step = _step(session, run_id, index)
            if step is None or step.status in STEP_TERMINAL:
                return Halt("step already finished")
            fenced = session.execute(
                update(Step)
                .where(Step.pk == step.pk, Step.polls == tick, Step.status.in_(_live_steps()))
                .values(polls=tick + 1, worker=self.worker, worker_pid=self.pid, updated_at=now)
            )
            if fenced.rowcount != 1:  # type: ignore[attr-defined]
                return Halt("duplicate or stale delivery")
            cancel_requested = not self._stamp(session, run_id, step, now)
            phase = _phase(session, run, step)
        tick += 1
        self.fenced_tick = tick
        if cancel_requested:
            return self._honour_cancel(run_id)
        if phase == "human":
            return Halt("parked for a human answer")
        if phase == "effects":
            return self._effects(run_id, index, tick)
        if phase == "start":
            return self._start(run_id, index, tick)
        return self._poll(run_id, index, tick)

    # -- phases ----------------------------------------------------------------------------
    def _start(self, run_id: str, index: int, tick: int) -> Outcome:
        """Claim the start, call the provider with no lock held, then record the turn.

        Invariant 2 rests on the claim: it is written (compare-and-set, only while no cancel
        is requested) before the call, and ``cancel`` waits for a live claim to clear before
        it reads the turns to stop. The call itself ends within ``ORCH_PROVIDER_TIMEOUT``
        (the transport's hard deadline), so that wait is bounded and no lock, not even
        SQLite's database-wide one, is held across network I/O.
        """
        now = self.clock()
        try:
            with session_scope(self.settings.database_url) as session:
                run, step = self._lock(session, run_id, index, tick, now, _STARTABLE)
                spec = _spec(run, index)
                if step.provider_run_id is not None:
                    return Poll(spec.poll_interval, tick)
                try:
                    rendered = templating.render(
                        spec.task,
                        _context(session, run),
                        "task",
                        limit=self.settings.max_rendered_task_bytes,
                    )
                except LimitExceeded as exc:
                    self._fail(session, run_id, f"step {step.step_id}: {exc}", now, over=True)
                    return Halt("task renders over its bound")
                except ValidationError as exc:
                    self._fail(session, run_id, f"step {step.step_id}: {exc}", now)
                    return Halt("task could not be rendered")
                if step.status == StepStatus.PENDING:
                    transition_step(
                        session,
                        step,
                        StepStatus.RUNNING,
                        cause="turn starting",
                        now=now,
                        values={"input": rendered},
                    )
                if run.status == RunStatus.QUEUED:
                    transition_run(
                        session, run_id, RunStatus.RUNNING, cause="first step starting", now=now
                    )
                touch_step(session, step, now, start_claimed_at=now)
                request = TurnRequest(
                    key=str(step.idempotency_key),
                    run_id=run_id,
                    step_id=step.step_id,
                    attempt=step.attempt,
                    input=rendered,
                    options=spec.options,
                    resume=step.answer,
                    resuming=step.attempt > 1,
                )
                provider_name, step_id = step.provider, step.step_id
        except _Cancelled:
            return self._after_refusal(run_id)
        provider = providers.get_provider(provider_name, self.settings)
        provider_run_id: str | None = None
        try:
            provider_run_id = provider.start(request)
        except RetryableProviderError as exc:
            return self._after_start(run_id, index, tick, request, provider_name, outage=str(exc))
        except PermanentProviderError as exc:
            return self._after_start(
                run_id, index, tick, request, provider_name, refused=f"step {step_id}: {exc}"
            )
        return self._after_start(run_id, index, tick, request, provider_name, provider_run_id)

    def _after_start(
        self,
        run_id: str,
        index: int,
        tick: int,
        request: TurnRequest,
        provider_name: str,
        provider_run_id: str | None = None,
        *,
        outage: str | None = None,
        refused: str | None = None,
    ) -> Outcome:
        """Record what the start call came to, and clear the claim."""
        now = self.clock()
        try:
            with session_scope(self.settings.database_url) as session:
                run, step = self._lock(session, run_id, index, tick, now, _STARTABLE)
                touch_step(session, step, now, start_claimed_at=None)
                if outage is not None:
                    return self._outage(session, run_id, index, tick, outage, now)
                if refused is not None:
                    self._fail(session, run_id, refused, now)
                    return Halt("provider refused the turn")
                assert provider_run_id is not None
                unfit = bounds.provider_id(provider_run_id, self.settings)
                if unfit:
                    self._fail(session, run_id, f"step {step.step_id}: {unfit}", now, over=True)
                    return Halt("provider run id over its bound")
                spec = _spec(run, index)
                touch_step(
                    session,
                    step,
                    now,
                    provider_run_id=provider_run_id,
                    last_provider_status="started",
                    error=None,
                    next_poll_at=now + timedelta(seconds=spec.poll_interval),
                )
                self._unpark(session, run_id, index, now)
                return Poll(spec.poll_interval, tick)
        except _Cancelled:
            self._release_refused_start(run_id, index, request, provider_name, provider_run_id)
            return self._after_refusal(run_id)

    def _release_refused_start(
        self,
        run_id: str,
        index: int,
        request: TurnRequest,
        provider_name: str,
        provider_run_id: str | None,
    ) -> None:
        """The run moved on while its turn was starting. If the step is still live (a cancel
        is waiting for this claim), hand it the turn's id and clear the claim: the canceller
        stops the turn. If the run already ended, this execution alone knows the turn's id,
        so it stops the turn itself."""
        now = self.clock()
        fit = provider_run_id is not None and bounds.provider_id(provider_run_id, self.settings)
        known = None if fit else provider_run_id
        with session_scope(self.settings.database_url) as session:
            step = _step(session, run_id, index, refresh=True)
            if step is None:
                return
            if touch_step(session, step, now, start_claimed_at=None, provider_run_id=known):
                return
            pk = step.pk
        if known is None:
            return
        ref = TurnRef(request.key, known, request.options)
        turn = turns.LiveTurn(run_id, index, pk, provider_name, ref)
        result = turns.stop_once(self.settings, turn)
        with session_scope(self.settings.database_url) as session:
            turns.stop_later(session, self.settings, self.dispatcher, [result], now, attempts=1)

    def _poll(self, run_id: str, index: int, tick: int) -> Outcome:
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, run_id)
            step = _step(session, run_id, index)
            assert run is not None and step is not None
            ref = turns.ref_for(run, step)
            provider_name = step.provider
        provider = providers.get_provider(provider_name, self.settings)
        try:
            observed = provider.status(ref)
        except RetryableProviderError as exc:
            with session_scope(self.settings.database_url) as session:
                try:
                    self._lock(session, run_id, index, tick, self.clock(), _STARTABLE)
                except _Cancelled:
                    return self._after_refusal(run_id)
                return self._outage(session, run_id, index, tick, str(exc), self.clock())
        except PermanentProviderError as exc:
            observed = TurnStatus(ProviderStatus.FAILED, raw="lost", error=str(exc))
        observed = self._fit(observed)
        now = self.clock()
        try:
            with session_scope(self.settings.database_url) as session:
                run, step = self._lock(session, run_id, index, tick, now, _STARTABLE)
                touch_step(session, step, now, last_provider_status=observed.raw[:200] or None)
                outcome = self._observe(session, run, step, observed, tick, now)
        except _Cancelled:
            return self._after_refusal(run_id)
        if isinstance(outcome, Proceed):
            return self._effects(run_id, index, tick)
        return outcome

    def _observe(
        self,
        session: Session,
        run: Run,
        step: Step,
        observed: TurnStatus,
        tick: int,
        now: datetime,
    ) -> Outcome:
        spec = _spec(run, step.index)
        status = observed.status
        if status in FINISHED:
            too_big = bounds.over(
                observed.output,
                self.settings.max_output_bytes,
                "the output",
                "ORCH_MAX_OUTPUT_BYTES",
            )
            if too_big:
                self._fail(session, run.id, f"step {step.step_id}: {too_big}", now, over=True)
                return Halt("output too large")
            self._unpark(session, run.id, step.index, now)
            touch_step(session, step, now, output=observed.output, error=None)
            effects.enqueue(session, self.settings, step, now=now)
            transition_run(
                session,
                run.id,
                RunStatus.WAITING,
                cause=f"step {step.step_id} turn finished ({observed.raw}); running effects",
                now=now,
            )
            return Proceed()
        if status in (ProviderStatus.FAILED, ProviderStatus.CANCELLED):
            why = observed.error or f"the provider ended the turn as {observed.raw!r}"
            self._fail(session, run.id, f"step {step.step_id}: {why}", now)
            return Halt("turn failed")
        if status is ProviderStatus.INPUT_REQUIRED:
            too_big = bounds.over(
                observed.prompt,
                self.settings.max_prompt_bytes,
                "the prompt",
                "ORCH_MAX_PROMPT_BYTES",
            )
            if too_big:
                self._fail(session, run.id, f"step {step.step_id}: {too_big}", now, over=True)
                return Halt("prompt too large")
            self._park(session, run, step, ParkReason.HUMAN, now, prompt=observed.prompt)
            return Halt("parked for a human answer")
        timeout_at = step_timeout_at(run, step)
        if timeout_at is not None and now >= timeout_at:
            self._time_out(session, run, step, now)
            return Halt("step timed out")
        if status is ProviderStatus.RATE_LIMITED:
            until = observed.reset_at or now + timedelta(seconds=spec.max_poll_interval)
            self._park(session, run, step, ParkReason.ENGINE_LIMIT, now, waiting_until=until)
            if self._expire_park(session, run.id, now):
                return Halt("park expired")
            wait = max(spec.poll_interval, (until - now).total_seconds())
            return Poll(self._bounded(min(wait, spec.max_poll_interval), timeout_at, now), tick)
        self._unpark(session, run.id, step.index, now, seen=run)
        return Poll(self._bounded(_backoff(spec, tick), timeout_at, now), tick)

    def _effects(self, run_id: str, index: int, tick: int) -> Outcome:
        with session_scope(self.settings.database_url) as session:
            step = _step(session, run_id, index)
            assert step is not None
            attempt = step.attempt
        progress = effects.run_due(self.settings, run_id, index, attempt, self.clock())
        now = self.clock()
        try:
            with session_scope(self.settings.database_url) as session:
                run, step = self._lock(session, run_id, index, tick, now, [RunStatus.WAITING.value])
                if progress.exhausted and self.settings.effect_policy == "fail":
                    close_run(
                        session,
                        self.settings,
                        run_id,
                        RunStatus.FAILED,
                        stop_reason=StopReason.EFFECT_FAILED,
                        cause=f"step {step.step_id}: an effect exhausted its attempts",
                        now=now,
                        error=f"step {step.step_id}: " + "; ".join(progress.exhausted),
                        step_error="; ".join(progress.exhausted),
                        dispatcher=self.dispatcher,
                    )
                    return Halt("effect exhausted its attempts")
                if not progress.settled:
                    wait = (progress.next_due - now).total_seconds() if progress.next_due else 0
                    return Poll(max(0.0, wait), tick)
                failed = "; ".join(progress.exhausted)
                transition_step(
                    session,
                    step,
                    StepStatus.COMPLETED,
                    cause="turn finished and effects ran" + (f"; {failed}" if failed else ""),
                    now=now,
                    values={"error": failed or None},
                )
                if index == len(run.workflow["steps"]) - 1:
                    close_run(
                        session,
                        self.settings,
                        run_id,
                        RunStatus.COMPLETED,
                        stop_reason=StopReason.COMPLETED,
                        cause="last step completed",
                        now=now,
                        result=step.output,
                        dispatcher=self.dispatcher,
                    )
                else:
                    transition_run(
                        session,
                        run_id,
                        RunStatus.RUNNING,
                        cause=f"step {step.step_id} completed",
                        now=now,
                        values={"current_step": index + 1},
                    )
                return Proceed()
        except _Cancelled:
            return self._after_refusal(run_id)

    def refuse(self, run_id: str, index: int, tick: int, what: str) -> Outcome:
        """The database refused a value this execution wrote (``DataError``, ``IntegrityError``):
        not an outage, so not retried; the step fails with ``what`` (no SQL parameters)."""
        now = self.clock()
        try:
            with session_scope(self.settings.database_url) as session:
                _, step = self._lock(session, run_id, index, tick, now, _MOVABLE)
                self._fail(
                    session,
                    run_id,
                    f"step {step.step_id}: the database refused a value ({what})",
                    now,
                )
        except _Cancelled:
            return self._after_refusal(run_id)
        return Halt("the database refused a value")

    # -- helpers ---------------------------------------------------------------------------
    def _lock(
        self,
        session: Session,
        run_id: str,
        index: int,
        tick: int,
        now: datetime,
        statuses: list[str],
    ) -> tuple[Run, Step]:
        """Lock the run row for this execution's write, only while the run is in ``statuses``
        with no cancel requested, the step is live, and no newer execution has fenced the step
        since (a worker woken from SIGSTOP must not write over its successor); raise
        :class:`_Cancelled` otherwise."""
        locked = session.execute(
            update(Run)
            .where(
                Run.id == run_id,
                Run.status.in_(statuses),
                Run.cancel_requested_at.is_(None),
            )
            .values(heartbeat_at=now)
        )
        if locked.rowcount != 1:  # type: ignore[attr-defined]
            raise _Cancelled
        run = session.get(Run, run_id, populate_existing=True)
        step = _step(session, run_id, index, refresh=True)
        assert run is not None and step is not None
        if step.status in STEP_TERMINAL or step.polls != tick:
            raise _Cancelled
        return run, step

    def _after_refusal(self, run_id: str) -> Outcome:
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, run_id)
            requested = (
                run is not None and run.status not in RUN_TERMINAL and bool(run.cancel_requested_at)
            )
        if requested:
            return self._honour_cancel(run_id)
        return Halt("run moved on under this execution")

    def _honour_cancel(self, run_id: str) -> Outcome:
        cancellation.finish(
            self.settings,
            self.dispatcher,
            run_id,
            now=self.clock(),
            stop_reason=StopReason.CANCEL_REQUESTED,
            cause="cancel honoured by the step task",
            revoke=False,
        )
        return Halt("cancel honoured")

    def _stamp(self, session: Session, run_id: str, step: Step, now: datetime) -> bool:
        """Stamp the heartbeat and the deadline, compare-and-set on the status the deadline was
        computed from; ``False`` when a cancel is requested or the run ended meanwhile."""
        for _ in range(3):
            run = session.get(Run, run_id, populate_existing=True)
            if run is None or run.status in RUN_TERMINAL or run.cancel_requested_at is not None:
                return False
            deadline = deadlines.compute(
                self.settings,
                RunStatus(run.status),
                heartbeat_at=now,
                step_timeout_at=step_timeout_at(run, step),
                park_reason=run.park_reason,
                parked_since=run.parked_since,
                waiting_until=run.waiting_until,
            )
            stamped = session.execute(
                update(Run)
                .where(
                    Run.id == run_id,
                    Run.status == run.status,
                    Run.cancel_requested_at.is_(None),
                )
                .values(
                    heartbeat_at=now, current_step=step.index, deadline_at=deadline, updated_at=now
                )
            )
            if stamped.rowcount == 1:  # type: ignore[attr-defined]
                return True
        return False

    def _fail(
        self, session: Session, run_id: str, error: str, now: datetime, *, over: bool = False
    ) -> None:
        """Fail the run; ``over`` when a value did not fit its bound (``over_limit``). The
        error is redacted and bounded first: it may quote what a provider answered."""
        text = bounds.error_text(error, self.settings)
        close_run(
            session,
            self.settings,
            run_id,
            RunStatus.FAILED,
            stop_reason=StopReason.OVER_LIMIT if over else StopReason.STEP_FAILED,
            cause="a value did not fit its bound" if over else "step failed",
            now=now,
            error=text,
            step_error=text,
            dispatcher=self.dispatcher,
        )

    def _fit(self, observed: TurnStatus) -> TurnStatus:
        """The observation with every provider string redacted and bounded, fit to store."""
        return replace(
            observed,
            raw=bounds.error_text(observed.raw, self.settings)[:200],
            output=bounds.json_value(observed.output, self.settings),
            prompt=bounds.json_value(observed.prompt, self.settings),
            error=None
            if observed.error is None
            else bounds.error_text(observed.error, self.settings),
        )

    def _time_out(self, session: Session, run: Run, step: Step, now: datetime) -> None:
        live = turns.live_turns(session, run)
        close_run(
            session,
            self.settings,
            run.id,
            RunStatus.TIMED_OUT,
            stop_reason=StopReason.STEP_TIMEOUT,
            cause=f"step {step.step_id} ran past its timeout",
            now=now,
            error=f"step {step.step_id} timed out",
            dispatcher=self.dispatcher,
        )
        turns.stop_later(session, self.settings, self.dispatcher, turns.pending(live), now)

    def _outage(
        self, session: Session, run_id: str, index: int, tick: int, error: str, now: datetime
    ) -> Outcome:
        run = session.get(Run, run_id, populate_existing=True)
        step = _step(session, run_id, index, refresh=True)
        assert run is not None and step is not None
        if step.status == StepStatus.PENDING:
            transition_step(session, step, StepStatus.RUNNING, cause="turn starting", now=now)
        if run.status == RunStatus.QUEUED:
            transition_run(session, run_id, RunStatus.RUNNING, cause="first step starting", now=now)
        touch_step(session, step, now, error=bounds.error_text(error, self.settings))
        self._park(session, run, step, ParkReason.PLATFORM_INTERRUPT, now)
        if self._expire_park(session, run_id, now):
            return Halt("park expired")
        spec = _spec(run, index)
        return Poll(self._bounded(_backoff(spec, tick), step_timeout_at(run, step), now), tick)

    def _park(
        self,
        session: Session,
        run: Run,
        step: Step,
        reason: ParkReason,
        now: datetime,
        *,
        waiting_until: datetime | None = None,
        prompt: Any = None,
    ) -> None:
        session.refresh(run)
        session.refresh(step)
        if step.status == StepStatus.RUNNING:
            transition_step(
                session,
                step,
                StepStatus.PARKED,
                cause=f"parked: {reason.value}",
                now=now,
                values={"prompt": prompt},
            )
        parked_since = run.parked_since if run.status == RunStatus.PARKED else now
        deadline = deadlines.compute(
            self.settings,
            RunStatus.PARKED,
            heartbeat_at=now,
            park_reason=reason.value,
            parked_since=parked_since,
            waiting_until=waiting_until,
        )
        values = {
            "park_reason": reason.value,
            "waiting_until": waiting_until,
            "deadline_at": deadline,
        }
        if run.status == RunStatus.PARKED:
            touch_run(session, run.id, now, **values)
        else:
            transition_run(
                session,
                run.id,
                RunStatus.PARKED,
                cause=f"parked: {reason.value}",
                now=now,
                values={**values, "parked_since": now},
            )
        session.refresh(run)

    def _unpark(
        self, session: Session, run_id: str, index: int, now: datetime, *, seen: Run | None = None
    ) -> None:
        """Move a parked run and step back to running. ``seen`` (a row this transaction
        locked and read) spares the two reads on the common path: nothing is parked."""
        if seen is not None and seen.status != RunStatus.PARKED:
            step_now = _step(session, run_id, index)
            if step_now is None or step_now.status != StepStatus.PARKED:
                return
        run = session.get(Run, run_id, populate_existing=True)
        step = _step(session, run_id, index, refresh=True)
        assert run is not None and step is not None
        if step.status == StepStatus.PARKED:
            transition_step(session, step, StepStatus.RUNNING, cause="resumed", now=now)
        if run.status == RunStatus.PARKED:
            transition_run(
                session,
                run_id,
                RunStatus.RUNNING,
                cause=f"resumed from {run.park_reason} park",
                now=now,
                values={"park_reason": None, "parked_since": None, "waiting_until": None},
            )

    def _expire_park(self, session: Session, run_id: str, now: datetime) -> bool:
        run = session.get(Run, run_id, populate_existing=True)
        assert run is not None
        if not health.park_expired(self.settings, run, now):
            return False
        live = turns.live_turns(session, run)
        close_run(
            session,
            self.settings,
            run_id,
            RunStatus.TIMED_OUT,
            stop_reason=StopReason.PARK_EXPIRED,
            cause=f"{run.park_reason} park ran past its budget",
            now=now,
            error=f"parked ({run.park_reason}) past its budget",
            dispatcher=self.dispatcher,
        )
        turns.stop_later(session, self.settings, self.dispatcher, turns.pending(live), now)
        return True

    @staticmethod
    def _bounded(countdown: float, timeout_at: datetime | None, now: datetime) -> float:
        """Never sleep past the step's timeout: the timeout is seen at the next execution."""
        if timeout_at is None:
            return countdown
        return max(0.0, min(countdown, (timeout_at - now).total_seconds() + 0.05))


def _live_steps() -> list[str]:
    return [status.value for status in STEP_LIVE]


def _step(session: Session, run_id: str, index: int, *, refresh: bool = False) -> Step | None:
    query = select(Step).where(Step.run_id == run_id, Step.index == index)
    if refresh:
        query = query.execution_options(populate_existing=True)
    return session.scalars(query).first()


def _spec(run: Run, index: int) -> StepSpec:
    return StepSpec.model_validate(run.workflow["steps"][index])


def _phase(session: Session, run: Run, step: Step) -> str:
    if run.status == RunStatus.WAITING and run.current_step == step.index:
        return "effects"
    if effects.for_step(session, run.id, step.index, step.attempt):
        return "effects"
    if step.status == StepStatus.PARKED and run.park_reason == ParkReason.HUMAN:
        return "human"
    if step.status == StepStatus.PENDING or step.provider_run_id is None:
        return "start"
    return "poll"


def _context(session: Session, run: Run) -> dict[str, Any]:
    steps = session.scalars(
        select(Step).where(Step.run_id == run.id, Step.status == StepStatus.COMPLETED.value)
    ).all()
    return {"args": run.args, "steps": {step.step_id: {"output": step.output} for step in steps}}


def _backoff(spec: StepSpec, tick: int) -> float:
    """``poll_interval`` for the first poll, doubling up to ``max_poll_interval``."""
    return float(min(spec.max_poll_interval, spec.poll_interval * 2 ** min(max(tick - 2, 0), 16)))
