"""One execution of a step task: the sequence of its transactions and provider calls.

* entry: fence, stamp, read, and for a start the claim (``fence``'s pieces); on PostgreSQL a
  poll's entry, and a first delivery's start whose task names no data, are one statement
  with no transaction around it; what that statement cannot finish goes on in a transaction;
* start: the provider start with no lock held, then at once one status call, so that a turn
  already finished is finished in this execution (no countdown hop);
* poll: one status call; nothing more is written unless the observation changed something;
* the write (one transaction): record what the call came to, and for a finished turn settle
  its effects, complete the step and move the run (``finishing``).

The outcome tells the task body what to do: :class:`Poll` (``self.retry(countdown=…)`` with
the next tick), :class:`Proceed` (return, so the chain sends the next step) or :class:`Halt`
(stop the chain: the run is terminal, parked for a human, or this delivery is a duplicate).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from orchestration import providers
from orchestration.core import pieces
from orchestration.core.db import utcnow
from orchestration.core.errors import (
    PermanentProviderError,
    RequestOverLimit,
    RetryableProviderError,
)
from orchestration.core.followups import Done, Transact
from orchestration.core.models import Run
from orchestration.core.settings import MARGIN_SECONDS, Settings
from orchestration.core.states import RUN_TERMINAL, RunStatus, StopReason
from orchestration.execution import agent_checks, calls, finishing, observing, parking, releasing
from orchestration.execution import entry as entries
from orchestration.execution.entry import Entry, Phase
from orchestration.execution.finishing import EffectsDue
from orchestration.execution.outcomes import Halt, Outcome, Poll, Proceed
from orchestration.execution.rows import MOVABLE, STARTABLE, Moved, fail, lock, step_of
from orchestration.execution.starting import StartCall, claim, plain_task, start_call
from orchestration.limits import bounds
from orchestration.observability import context, tracing
from orchestration.providers import budget
from orchestration.providers.base import FINISHED, TurnRef, TurnStatus
from orchestration.runs import artifacts, cancellation, effects
from orchestration.runs.transitions import touch_step
from orchestration.workflows import decoded


class Stepper:
    """Advances runs' steps; one instance per worker process."""

    def __init__(
        self,
        settings: Settings,
        transact: Transact,
        *,
        clock: Callable[[], datetime] = utcnow,
        worker: str | None = None,
        pid: int | None = None,
    ) -> None:
        self.settings = settings
        self.transact = transact
        self.clock = clock
        self.worker = worker
        self.pid = pid
        #: The tick this process's current execution fenced (``None`` before the fence): a
        #: task that retries after a database error carries it, so it still owns the step.
        self.fenced_tick: int | None = None

    # -- entry -----------------------------------------------------------------------------
    def advance(self, run_id: str, index: int, tick: int, *, chained: bool = True) -> Outcome:
        """One execution of step ``index`` of ``run_id`` holding fencing token ``tick``.

        ``chained`` says whether the message carries the next link of the chain; the step
        that finishes without one arms the next segment."""
        self.fenced_tick = None
        now = self.clock()
        quick: Entry | None = None
        rendered: Any = None
        if pieces.one_statement(self.settings):
            # The entry's pieces as one statement with no transaction around it: a poll, or
            # the first delivery of a step whose task renders without the run's data (its
            # claim rides on the fence). What it cannot finish goes on in a transaction.
            first = self.transact(
                lambda session: Done(self._enter(session, run_id, index, tick, now, quick=True)),
                autocommit=True,
            )
            if first is not None:
                found, rendered = first
                if isinstance(found, Halt):
                    return found
                quick = found
                self._bind(quick)
                if quick.stamped and quick.phase is Phase.POLL:
                    return self._poll(run_id, index, quick, chained)
                if quick.stamped and quick.step.claimed:
                    call = start_call(self.settings, quick, rendered, now)
                    return self._start(run_id, index, quick, call, chained)
        started: list[Entry] = []

        def enter(session: Session) -> Done[Entry | StartCall | Outcome]:
            nonlocal rendered
            entry = quick
            if entry is None:
                found = self._enter(session, run_id, index, tick, now, quick=False)
                assert found is not None
                entered, rendered = found
                if isinstance(entered, Halt):
                    return Done(entered)
                entry = entered
            if quick is not None or not entry.stamped:
                # Stamped here, on the status read: the stamp holds the run row until the
                # commit, so a claim below is ordered before any cancel.
                entry = entries.stamp(session, self.settings, run_id, entry, now)
            if quick is not None:
                held = entries.still_fenced(session, self.settings, run_id, entry, now)
                if held is None:
                    return Done(Halt("duplicate or stale delivery"))
                entry = held
            started.append(entry)
            if entry.phase is Phase.START:
                claimed = claim(session, self.settings, run_id, entry, now, rendered=rendered)
                return Done(claimed.value, claimed.then)
            return Done(entry)

        got = self.transact(enter)
        if not started:
            assert isinstance(got, Halt)
            return got
        entry = started[0]
        self._bind(entry)
        if isinstance(got, StartCall):
            return self._start(run_id, index, entry, got, chained)
        if isinstance(got, (Poll, Proceed, Halt)):
            return got
        if entry.phase is Phase.CANCEL:
            return self._honour_cancel(run_id)
        if entry.phase is Phase.HUMAN:
            return Halt("parked for a human answer")
        if entry.phase is Phase.EFFECTS:
            return self._effects(run_id, index, entry.tick, chained)
        return self._poll(run_id, index, entry, chained)

    def _enter(
        self, session: Session, run_id: str, index: int, tick: int, now: datetime, *, quick: bool
    ) -> tuple[Entry | Halt, Any] | None:
        """The entry, with the start's claim when this first delivery's task renders without
        the run's data; ``None`` when ``quick`` and only a transaction can take it (a first
        delivery that renders from the run's data)."""
        steps = decoded.of_run(session, run_id)
        # A run with no such step (gone, purged) fences nothing: the entry halts.
        rendered = (
            plain_task(self.settings, steps[index]) if not tick and index < len(steps) else None
        )
        if quick and not tick and rendered is None:
            return None
        found = entries.enter(
            session,
            self.settings,
            run_id,
            index,
            tick,
            now,
            worker=self.worker,
            pid=self.pid,
            rendered=rendered,
            quick=quick,
        )
        return found, rendered

    # -- phases ----------------------------------------------------------------------------
    def _start(
        self, run_id: str, index: int, entry: Entry, call: StartCall, chained: bool
    ) -> Outcome:
        provider = providers.get_provider(call.provider, self.settings)
        observed: TurnStatus | None = None
        captured = None
        provider_run_id: str | None = None
        outage = refused = None
        # The claim's window is one call plus the margin, from the claim's time; a commit
        # that came back later than the margin (a slow or cut link) leaves too little of it,
        # and a call then could outlast it: a cancel would no longer wait for this start.
        late = (self.clock() - call.claimed_at).total_seconds()
        if late >= MARGIN_SECONDS:
            outage = f"the start claim took {late:.1f}s to commit; the turn starts later"
            return self._after_start(run_id, index, entry, call, None, chained, outage=outage)
        # The start, and the status and checkpoint right after it, share one call's bound;
        # what follows them (the record, a cancel honoured) is outside it.
        with budget.within(self.settings.provider_timeout):
            checked = agent_checks.before_start(
                self.settings,
                self.transact,
                entry,
                call.provider,
                call.request.options,
                self.clock(),
            )
            outage = checked.outage
            if checked.refused is not None:
                refused = PermanentProviderError(checked.refused)
            try:
                if outage is None and refused is None and checked.changed is None:
                    with tracing.span(
                        "provider.start", provider=call.provider, key=call.request.key
                    ):
                        provider_run_id = provider.start(call.request)
            except RetryableProviderError as exc:
                outage = str(exc)
            except PermanentProviderError as exc:
                refused = exc
            if provider_run_id is not None and not bounds.provider_id(
                provider_run_id, self.settings
            ):
                ref = TurnRef(call.request.key, provider_run_id, entry.spec.options)
                observed = calls.status(self.settings, call.provider, ref)
                captured = calls.capture(self.settings, call.provider, ref, observed)
        return self._after_start(
            run_id,
            index,
            entry,
            call,
            provider_run_id,
            chained,
            outage=outage,
            refused=refused,
            observed=observed,
            captured=captured,
            checked=checked,
        )

    def _after_start(
        self,
        run_id: str,
        index: int,
        entry: Entry,
        call: StartCall,
        provider_run_id: str | None,
        chained: bool,
        *,
        outage: str | None = None,
        refused: PermanentProviderError | None = None,
        observed: TurnStatus | None = None,
        captured: tuple[Any, str | None] | None = None,
        checked: agent_checks.Checked | None = None,
    ) -> Outcome:
        """Record what the start call came to (and what the agent said of itself before
        it), clear the claim, and act on the first status."""
        now = self.clock()
        spec, tick = entry.spec, entry.tick

        def record(session: Session) -> Done[Outcome | EffectsDue]:
            run, step = lock(session, run_id, index, tick, now, STARTABLE)
            unfit = provider_run_id is not None and bounds.provider_id(
                provider_run_id, self.settings
            )
            seen = checked.kept(step.evidence) if checked is not None else {}
            if outage is not None or refused is not None or unfit or provider_run_id is None:
                touch_step(session, step, now, start_claimed_at=None, **seen)
            if checked is not None and checked.changed is not None:
                return Done(
                    Halt("the pinned agent changed"),
                    fail(
                        session,
                        self.settings,
                        run_id,
                        checked.changed,
                        now,
                        reason=StopReason.AGENT_CHANGED,
                    ),
                )
            if outage is not None:
                return observing.outage(session, self.settings, run, step, spec, outage, now)
            if refused is not None:
                over = isinstance(refused, RequestOverLimit)
                error = f"step {step.step_id}: {refused}"
                return Done(
                    Halt("provider refused the turn"),
                    fail(session, self.settings, run_id, error, now, over=over),
                )
            assert provider_run_id is not None
            if unfit:
                error = f"step {step.step_id}: {unfit}"
                return Done(
                    Halt("provider run id over its bound"),
                    fail(session, self.settings, run_id, error, now, over=True),
                )
            recorded = {
                "start_claimed_at": None,
                "provider_run_id": provider_run_id,
                # What the status call right after the start said, so that the first poll
                # writes only if the turn has moved on since.
                "last_provider_status": (observed.raw[:200] or None) if observed else "started",
                "error": None,
                "next_poll_at": now + timedelta(seconds=spec.poll_interval),
                **seen,
            }
            if observed is not None and observed.status in FINISHED:
                return finishing.finish(
                    session,
                    self.settings,
                    run,
                    step,
                    observed.output,
                    now,
                    captured=captured,
                    steps=len(decoded.of_run(session, run_id)),
                    chained=chained,
                    recorded=recorded,
                )
            touch_step(session, step, now, **recorded)
            parking.unpark(session, run, step, now)
            return Done(Poll(spec.poll_interval, tick))

        try:
            outcome = self.transact(record)
        except Moved:
            releasing.release_refused_start(
                self.settings,
                self.transact,
                self.clock(),
                run_id,
                index,
                call,
                provider_run_id,
                observed,
            )
            return self._after_refusal(run_id)
        return self._settle(run_id, index, tick, outcome, chained)

    def _poll(self, run_id: str, index: int, entry: Entry, chained: bool) -> Outcome:
        assert entry.step.provider_run_id is not None
        ref = TurnRef(entry.step.idempotency_key, entry.step.provider_run_id, entry.spec.options)
        outage: str | None = None
        with budget.within(self.settings.provider_timeout):
            try:
                observed = calls.status(self.settings, entry.step.provider, ref, raise_outage=True)
            except RetryableProviderError as exc:
                outage = str(exc)
            else:
                captured = calls.capture(self.settings, entry.step.provider, ref, observed)
        if outage is not None:
            return self._write(run_id, index, entry, chained, outage=outage)
        now = self.clock()
        if observing.unchanged(entry, observed, now):
            countdown = parking.next_poll(entry.spec, entry.step.started_at, entry.tick, now)
            return Poll(countdown, entry.tick)
        return self._write(run_id, index, entry, chained, observed=observed, captured=captured)

    def _write(
        self,
        run_id: str,
        index: int,
        entry: Entry,
        chained: bool,
        *,
        observed: TurnStatus | None = None,
        captured: tuple[Any, str | None] | None = None,
        outage: str | None = None,
    ) -> Outcome:
        """The poll's one write: what the observation changed."""
        now = self.clock()
        spec, tick = entry.spec, entry.tick

        def write(session: Session) -> Done[Outcome | EffectsDue]:
            run, step = lock(session, run_id, index, tick, now, STARTABLE)
            if outage is not None:
                return observing.outage(session, self.settings, run, step, spec, outage, now)
            assert observed is not None
            return observing.observe(
                session,
                self.settings,
                run,
                step,
                spec,
                observed,
                now,
                captured=captured,
                steps=len(decoded.of_run(session, run_id)),
                chained=chained,
            )

        try:
            outcome = self.transact(write)
        except Moved:
            return self._after_refusal(run_id)
        return self._settle(run_id, index, tick, outcome, chained)

    def _effects(self, run_id: str, index: int, tick: int, chained: bool) -> Outcome:
        """Run the due effects of the step (the outbox), then complete it once they settle."""
        attempt = self.transact(lambda session: Done(_attempt_of(session, run_id, index)))
        progress = effects.run_due(
            self.transact, self.settings, run_id, index, attempt, self.clock()
        )
        now = self.clock()

        def settle(session: Session) -> Done[Outcome | EffectsDue]:
            run, step = lock(session, run_id, index, tick, now, [RunStatus.WAITING])
            if not progress.settled and not (
                progress.exhausted and self.settings.effect_policy == "fail"
            ):
                wait = (progress.next_due - now).total_seconds() if progress.next_due else 0
                return Done(Poll(max(0.0, wait), tick))
            return finishing.complete(
                session,
                self.settings,
                run,
                step,
                artifacts.Kept(step.output, step.output_sha256),
                progress,
                now,
                steps=len(decoded.of_run(session, run_id)),
                chained=chained,
            )

        try:
            outcome = self.transact(settle)
        except Moved:
            return self._after_refusal(run_id)
        assert not isinstance(outcome, EffectsDue)
        return outcome

    def refuse(self, run_id: str, index: int, tick: int, what: str) -> Outcome:
        """The database refused a value this execution wrote (``DataError``, ``IntegrityError``):
        not an outage, so not retried; the step fails with ``what`` (no SQL parameters)."""
        now = self.clock()

        def refuse(session: Session) -> Done[Outcome]:
            _, step = lock(session, run_id, index, tick, now, MOVABLE)
            error = f"step {step.step_id}: the database refused a value ({what})"
            return Done(
                Halt("the database refused a value"),
                fail(session, self.settings, run_id, error, now),
            )

        try:
            return self.transact(refuse)
        except Moved:
            return self._after_refusal(run_id)

    # -- helpers ---------------------------------------------------------------------------
    def _bind(self, entry: Entry) -> None:
        """This execution owns the step from the tick it fenced; its log lines say where."""
        self.fenced_tick = entry.tick
        context.bind(
            step_id=entry.step.step_id, attempt=entry.step.attempt, phase=entry.phase.value
        )

    def _settle(
        self, run_id: str, index: int, tick: int, outcome: Outcome | EffectsDue, chained: bool
    ) -> Outcome:
        if isinstance(outcome, EffectsDue):
            return self._effects(run_id, index, tick, chained)
        return outcome

    def _after_refusal(self, run_id: str) -> Outcome:
        requested = self.transact(lambda session: Done(_cancel_requested(session, run_id)))
        if requested:
            return self._honour_cancel(run_id)
        return Halt("run moved on under this execution")

    def _honour_cancel(self, run_id: str) -> Outcome:
        cancellation.finish(
            self.transact,
            self.settings,
            run_id,
            now=self.clock(),
            stop_reason=StopReason.CANCEL_REQUESTED,
            cause="cancel honoured by the step task",
            revoke=False,
        )
        return Halt("cancel honoured", revoked=True)


def _attempt_of(session: Session, run_id: str, index: int) -> int:
    step = step_of(session, run_id, index)
    assert step is not None
    return step.attempt


def _cancel_requested(session: Session, run_id: str) -> bool:
    run = session.get(Run, run_id)
    return run is not None and run.status not in RUN_TERMINAL and bool(run.cancel_requested_at)
