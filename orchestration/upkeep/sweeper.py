"""The sweeper: closes what nobody else will. Run by beat every ``ORCH_SWEEP_INTERVAL``.

It reads only live runs (through the partial index ``ix_runs_live``), so its cost grows with
live runs, not history. Every action is a compare-and-set, so a pass is idempotent and two
beats running at once close each run once. ``now`` is a parameter: tests pass the clock.

Rules, per live run, first owner decides (the table is ``sweep_rules.RULES``, which
``explain`` reads too):

1. cancel enforcement: ``cancelling`` past ``ORCH_CANCEL_GRACE`` with a dead heartbeat;
2. claim promotion: a run queued behind a key whose holder is gone gets the key;
3. branches: a branch run waiting for a slot is admitted once its step has one, and a step
   parked on its branches is settled (admitted, failed or joined) as they stand;
4. approval expiry: an approval step undecided at its ``expires_in`` gets its ``on_expiry``;
5. park expiry: parked past its budget (and any ``waiting_until``);
6. dead heartbeat: re-armed up to ``ORCH_MAX_REARMS`` times, then ``interrupted``;
7. run deadline: a backstop; past ``deadline_at`` with nothing having ended it, closed
   ``deadline_exceeded``;

Each owner's runs take at most ``ORCH_SWEEP_ACTIONS_PER_OWNER`` actions a pass, in rounds
across owners (``shares.round_robin``; each owner's least recently touched runs first), and
no action starts once the pass has run its ``budget``: the rest waits for the next pass
(``deferred``), so one owner's backlog cannot crowd out another's runs. Then it stamps its
own liveness row and adds the pass's time to ``fleet_series`` (dropping
what is older than the fleet page shows). Before the rules, a live branch run whose parent has
ended (its parent's hand-off was lost) is ended ``cancelled`` (``parent_ended``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from orchestration.core import deadlines, health
from orchestration.core.db import constant_in, utcnow
from orchestration.core.errors import IllegalTransition
from orchestration.core.followups import Done, Followups, Transact
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    ConcurrencyState,
    ParkReason,
    RunStatus,
    StepStatus,
    StopReason,
)
from orchestration.execution import approving, branching
from orchestration.observability import context, tracing
from orchestration.runs import cancellation, chains, closing, concurrency
from orchestration.runs.transitions import lock_run, touch_run, transition_run, transition_step
from orchestration.upkeep import shares, sweep_rules, sweeper_beat

LOG = logging.getLogger(__name__)
SWEEPER_NAME = "default"


class Sweeper:
    """One sweeper; :meth:`sweep` is one pass."""

    def __init__(
        self,
        settings: Settings,
        transact: Transact,
        *,
        clock: Callable[[], datetime] = utcnow,
        budget: float | None = None,
    ) -> None:
        self.settings = settings
        self.transact = transact
        self.clock = clock
        #: Seconds after which a pass starts no more actions (``None``: no bound).
        self.budget = budget
        #: How long a sweeper write waits on a locked row before it skips that run for this
        #: pass (PostgreSQL): a worker frozen mid-transaction must not hold up every run.
        self.lock_timeout = min(2.0, settings.sweep_interval)

    def sweep(self, now: datetime | None = None) -> dict[str, Any]:
        """One pass; returns counts of what it did (``orchestration sweep --json``).

        With ``now`` (tests), every run is judged at that instant. Without it, each run is
        judged at the clock's time when the pass reaches it, so a pass that was delayed never
        writes a stale time.
        """
        started = time.perf_counter()
        at = now or self.clock()
        report: dict[str, Any] = {
            "at": at.isoformat(),
            "live": 0,
            "cancels_enforced": 0,
            "promoted": 0,
            "branches_ended": 0,
            "branches_admitted": 0,
            "branches_settled": 0,
            "approvals_expired": 0,
            "parks_expired": 0,
            "rearmed": 0,
            "interrupted": 0,
            "deadlines_exceeded": 0,
            "busy": 0,
            "errors": 0,
            "deferred": 0,
        }
        live = self.transact(lambda session: _live_runs(session, self.settings, at))
        report["live"] = len(live)
        ids = {run.id for run, _ in live}
        acting = sorted(
            (
                one
                for one in live
                if _orphan(one[0], ids) or sweep_rules.acts(self.settings, *one, at)
            ),
            key=lambda one: one[0].updated_at,
        )
        taken, report["deferred"] = shares.round_robin(
            acting, lambda one: one[0].owner, self.settings.sweep_actions_per_owner
        )
        for done, (run, judged) in enumerate(taken):
            if self.budget is not None and time.perf_counter() - started >= self.budget:
                report["deferred"] += len(taken) - done
                break
            try:
                if _orphan(run, ids):
                    action = self._branch_ended(run, now or self.clock())
                else:
                    action = self._one(run, judged, now or self.clock())
            except (IllegalTransition, IntegrityError):
                action = None  # another writer (a step, a second beat) got there first
            except OperationalError:
                # The row stayed locked past the lock timeout (a frozen writer, whose
                # transaction the server aborts after the heartbeat timeout): next pass.
                action = "busy"
            except Exception:
                LOG.exception("sweeper failed on run %s", run.id)
                report["errors"] += 1
                action = None
            if action:
                report[action] += 1
        report["seconds"] = round(time.perf_counter() - started, 4)
        self._stamp(now or self.clock(), report)
        return report

    def _one(self, run: Run, judged: health.Judged, now: datetime) -> str | None:
        """Apply the first rule of ``sweep_rules.RULES`` that owns the run, if it is due
        (``judged``: what the SQL judged of the run when the pass read it)."""
        rule = sweep_rules.owner(self.settings, run, judged, now)
        if rule is None or not rule.due(self.settings, run, judged, now):
            return None
        with context.acting(run.id, f"sweeper.{rule.name}", owner=run.owner):
            done: bool = getattr(self, f"_{rule.name}")(run, rule, now)
            tracing.annotate({"acted": done})
        return rule.name if done else None

    def _branch_ended(self, run: Run, now: datetime) -> str | None:
        """A live branch run of an ended parent: the parent's hand-off was lost."""

        with context.acting(run.id, "sweeper.branches_ended", owner=run.owner):
            ended = self.transact(
                lambda session: branching.end_orphan(session, self.settings, run.id, now),
                lock_timeout=self.lock_timeout,
            )
        return "branches_ended" if ended else None

    def _branches_admitted(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        assert run.parent_run_id is not None and run.parent_step is not None
        parent, index = run.parent_run_id, run.parent_step
        return self.transact(
            lambda session: branching.settle(session, self.settings, parent, index, now),
            lock_timeout=self.lock_timeout,
        )

    def _branches_settled(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        return self.transact(
            lambda session: branching.settle(session, self.settings, run.id, run.current_step, now),
            lock_timeout=self.lock_timeout,
        )

    def _cancels_enforced(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        return cancellation.finish(
            self.transact,
            self.settings,
            run.id,
            now=now,
            stop_reason=StopReason.CANCEL_ENFORCED,
            cause="cancel enforced by the sweeper: grace over and heartbeat dead",
            revoke=True,
            lock_timeout=self.lock_timeout,
            inline=False,
        )

    def _approvals_expired(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        def settle(session: Session) -> Done[bool]:
            then = approving.expire(session, self.settings, run.id, now)
            return Done(then is not None, then or Followups())

        return self.transact(settle, lock_timeout=self.lock_timeout)

    def _parks_expired(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        return self._close(
            run,
            rule,
            now,
            RunStatus.TIMED_OUT,
            StopReason.PARK_EXPIRED,
            f"{run.park_reason} park ran past its budget (sweeper)",
        )

    def _interrupted(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        return self._close(
            run,
            rule,
            now,
            RunStatus.INTERRUPTED,
            StopReason.HEARTBEAT_LOST,
            f"heartbeat dead after {run.rearms} re-arms (sweeper)",
        )

    def _deadlines_exceeded(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        # The backstop: a live run past the deadline it stated, with a fresh heartbeat, is one
        # whose own bound (a step timeout) went unenforced, e.g. behind an overloaded worker.
        return self._close(
            run,
            rule,
            now,
            RunStatus.TIMED_OUT,
            StopReason.DEADLINE_EXCEEDED,
            "run passed its deadline_at and nothing had ended it (sweeper)",
        )

    def _close(
        self,
        run: Run,
        rule: sweep_rules.Rule,
        now: datetime,
        to: RunStatus,
        reason: StopReason,
        cause: str,
    ) -> bool:
        """Close the run if ``rule`` still owns its fresh, locked row (the pass read a
        snapshot; a step may have moved the run since). Returns whether it closed it.
        Provider cancels never run in a pass (one hanging provider must not hold it): they
        are handed off."""

        def close(session: Session) -> Done[bool]:
            lock_run(session, run.id, now)
            current = session.get(Run, run.id, populate_existing=True)
            if current is None or current.status in RUN_TERMINAL:
                return Done(False)
            judged = health.judge(session, self.settings, run.id, now)
            if judged is None or sweep_rules.owner(self.settings, current, judged, now) is not rule:
                return Done(False)
            then = closing.end_run(
                session,
                self.settings,
                run.id,
                to,
                stop_reason=reason,
                cause=cause,
                now=now,
                error=cause,
            )
            return Done(True, then)

        return self.transact(close, lock_timeout=self.lock_timeout)

    def _rearmed(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        """Re-dispatch the run's chain from its current step. A compare-and-set on the re-arm
        count and on the heartbeat this pass saw: a second beat, or a step that stamped the
        run since the pass read it, makes this a no-op."""
        seen_beat = (
            Run.heartbeat_at.is_(None)
            if run.heartbeat_at is None
            else Run.heartbeat_at == run.heartbeat_at
        )

        def rearm(session: Session) -> Done[bool]:
            claimed = session.execute(
                update(Run)
                .where(
                    Run.id == run.id,
                    Run.rearms == run.rearms,
                    seen_beat,
                    constant_in(Run.status, RUN_LIVE),
                )
                .values(rearms=run.rearms + 1, heartbeat_at=now, updated_at=now)
            )
            if claimed.rowcount != 1:  # type: ignore[attr-defined]
                return Done(False)
            current = session.get(Run, run.id, populate_existing=True)
            assert current is not None
            if current.status == RunStatus.RUNNING:
                transition_run(
                    session,
                    run.id,
                    RunStatus.PARKED,
                    cause=f"worker lost (heartbeat dead); re-armed {current.rearms}/"
                    f"{self.settings.max_rearms}",
                    now=now,
                    values={
                        "park_reason": ParkReason.PLATFORM_INTERRUPT.value,
                        "parked_since": now,
                        "waiting_until": None,
                    },
                )
                self._park_step(session, run.id, now)
                session.refresh(current)
            return Done(True, chains.arm(session, self.settings, current, now=now))

        return self.transact(rearm, lock_timeout=self.lock_timeout)

    @staticmethod
    def _park_step(session: Session, run_id: str, now: datetime) -> None:
        step = session.scalars(
            select(Step).where(Step.run_id == run_id, Step.status == StepStatus.RUNNING.value)
        ).first()
        if step is not None:
            transition_step(
                session, step, StepStatus.PARKED, cause="worker lost; re-armed", now=now
            )

    def _promoted(self, run: Run, rule: sweep_rules.Rule, now: datetime) -> bool:
        """Refresh the deadline of a run waiting for its key; promote it if the key is free."""
        assert run.concurrency_key is not None
        key = run.concurrency_key

        def promote(session: Session) -> Done[bool]:
            holder = concurrency.holder(session, run.owner, key)
            if holder is not None:
                touch_run(
                    session,
                    run.id,
                    now,
                    deadline_at=concurrency.queued_deadline(self.settings, holder.deadline_at, now),
                )
                return Done(False)
            first = concurrency.first_queued(session, run.owner, key)
            if first is None or first.id != run.id:
                touch_run(
                    session,
                    run.id,
                    now,
                    deadline_at=deadlines.compute(
                        self.settings, RunStatus.QUEUED, heartbeat_at=now
                    ),
                )
                return Done(False)
            then = chains.arm(
                session, self.settings, first, now=now, concurrency=ConcurrencyState.HOLDING
            )
            return Done(True, then)

        return self.transact(promote, lock_timeout=self.lock_timeout)

    def _stamp(self, now: datetime, report: dict[str, Any]) -> None:
        try:
            self._write_stamp(now, report)
        except IntegrityError:
            self._write_stamp(now, report)  # a second beat inserted the row first
        except OperationalError:
            LOG.warning("sweeper liveness row is locked; the next pass stamps it")

    def _write_stamp(self, now: datetime, report: dict[str, Any]) -> None:
        self.transact(
            lambda session: sweeper_beat.write(session, SWEEPER_NAME, now, report),
            lock_timeout=self.lock_timeout,
        )


def _orphan(run: Run, live: set[str]) -> bool:
    """A live branch run whose parent is no longer live: its parent's hand-off was lost."""
    return run.parent_run_id is not None and run.parent_run_id not in live


def _live_runs(
    session: Session, settings: Settings, now: datetime
) -> Done[list[tuple[Run, health.Judged]]]:
    """The live runs, each with what the SQL judges of it at ``now``."""
    rows = session.execute(
        select(Run, *health.JUDGEMENTS).where(constant_in(Run.status, RUN_LIVE)),
        health.params(settings, now),
    ).all()
    live = [(row[0], health.judged(row)) for row in rows]
    session.expunge_all()
    return Done(live)
