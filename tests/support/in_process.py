"""A worker and a beat played in-process, deterministically, on a clock of the test's.

:class:`World` stands one deployment up with a recording queue, and delivers every task the
engine sends, earliest first, as a worker would: a poll's retry after its countdown (with no
chain behind it), the next link of a chain at once, the stop task; the beat's sweep every
``sweep_interval``. Nothing sleeps; a task revoked before its turn is discarded, as a worker
discards it. The scripted provider plays its states on the real clock: :func:`age_turns`
moves them on.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import DataError, IntegrityError

from orchestration.core.db import session_scope
from orchestration.core.followups import ChainPlan
from orchestration.core.settings import Settings
from orchestration.execution import Outcome, Poll, Proceed, Stepper
from orchestration.providers.scripted import TURNS, store_url
from orchestration.runs import turns
from orchestration.runtime import executor as executor_module
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.upkeep.sweeper import Sweeper
from tests.unit.support import T0, Clock, RecordingDispatcher


@dataclass(frozen=True)
class _Link:
    """A delivery of the step task: its segment, its link, its tick, and whether the rest
    of the segment is behind it (a retry for a poll carries no chain)."""

    plan: ChainPlan
    position: int
    tick: int
    chained: bool
    #: A second delivery of the same message.
    again: bool = False


@dataclass(frozen=True)
class _Stop:
    """A delivery of the stop task."""

    run_id: str
    index: int


@dataclass(frozen=True)
class _Sweep:
    """A sweeper pass."""


_Task = _Link | _Stop | _Sweep

#: Seconds after its first delivery that a step task is delivered again.
REDELIVERY = 0.05

#: Called after every delivery and every action: when, what, what it came to.
Observer = Callable[[datetime, str, object], None]


class World:
    """One deployment, its queue recorded and its tasks delivered in-process (module
    docstring). The executor's own follow-ups (joins, the ends of branch runs, provider
    stops) are carried out at ``utcnow()``: here, at the clock every other writer reads."""

    def __init__(
        self, settings: Settings, monkeypatch: pytest.MonkeyPatch, observe: Observer
    ) -> None:
        self.settings = settings
        self.clock = Clock(T0)
        self.queue = RecordingDispatcher()
        self.transact = Executor(settings, self.queue)
        monkeypatch.setattr(executor_module, "utcnow", self.clock)
        self.stepper = Stepper(settings, self.transact, clock=self.clock, worker="w", pid=1)
        self.orch = Orchestrator(settings, self.queue, clock=self.clock)
        self.sweeper = Sweeper(settings, self.transact, clock=self.clock)
        self.observe = observe
        #: Executions of the step task per ``(run id, step index)``.
        self.executions: Counter[tuple[str, int]] = Counter()
        #: Deliver every step task a second time, :data:`REDELIVERY` seconds after the
        #: first, as a broker redelivers a message whose ack was lost.
        self.redeliver = False
        self._due: list[tuple[datetime, int, _Task]] = []
        self._order = itertools.count()
        self._chains = self._stops = 0
        self._after(settings.sweep_interval, _Sweep())

    def act(self, what: str, action: Callable[[], Any]) -> Any:
        """A caller's action (a launch, an answer, a cancel), observed like a delivery."""
        done = action()
        self.observe(self.clock.now, what, "done")
        return done

    def play(self, until: Callable[[], bool] | None = None) -> None:
        """Deliver what falls due, earliest first, until ``until`` holds (without it, until
        nothing but the sweeper is due)."""
        for _ in range(500):
            self._collect()
            if until is not None and until():
                return
            if until is None and all(isinstance(task, _Sweep) for _, _, task in self._due):
                return
            self._deliver()
        pytest.fail("still delivering after 500 tasks")

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass, delivering what falls due meanwhile."""
        end = self.clock.now + timedelta(seconds=seconds)
        self._collect()
        while self._due[0][0] <= end:
            self._deliver()
            self._collect()
        self.clock.now = end

    def lose(self) -> None:
        """Every step task now queued or waiting for its countdown is lost, as with a
        worker that died holding them (the sweeper's re-arm sends them again)."""
        self._collect()
        kept = [due for due in self._due if not isinstance(due[2], _Link)]
        heapq.heapify(kept)
        self._due = kept
        self.observe(self.clock.now, "lost", "every step task")

    def _deliver(self) -> None:
        at, _, task = heapq.heappop(self._due)
        self.clock.now = max(self.clock.now, at)
        if isinstance(task, _Sweep):
            report = self.sweeper.sweep(now=self.clock())
            done = {key: value for key, value in report.items() if key not in ("at", "seconds")}
            self.observe(self.clock.now, "sweep", {key: n for key, n in done.items() if n})
            self._after(self.settings.sweep_interval, _Sweep())
        elif isinstance(task, _Stop):
            countdown = turns.attempt(
                self.transact, self.settings, task.run_id, task.index, self.clock()
            )
            self.observe(self.clock.now, f"{task.run_id} stop {task.index}", countdown)
            if countdown is not None:
                self._after(countdown, task)
        else:
            self._step(task)

    def _step(self, task: _Link) -> None:
        """The step task's body (``tasks.steps.advance_step``)."""
        link = task.plan.links[task.position]
        run_id, what = task.plan.run_id, f"{task.plan.run_id} step {link.index} tick {task.tick}"
        what += " (again)" if task.again else ""
        if link.task_id in {revoked for ids, _ in self.queue.revoked for revoked in ids}:
            self.observe(self.clock.now, what, "discarded: revoked")
            return
        self.executions[run_id, link.index] += 1
        outcome: Outcome
        try:
            outcome = self.stepper.advance(run_id, link.index, task.tick, chained=task.chained)
        except (DataError, IntegrityError) as exc:
            owned = self.stepper.fenced_tick if self.stepper.fenced_tick is not None else task.tick
            self.observe(self.clock.now, what, f"refused by the database: {exc.orig}")
            refused = type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__
            outcome = self.stepper.refuse(run_id, link.index, owned, refused)
        self.observe(self.clock.now, what, outcome)
        if task.again:
            return
        if self.redeliver:
            self._after(REDELIVERY, replace(task, again=True))
        if isinstance(outcome, Poll):
            self._after(outcome.countdown, _Link(task.plan, task.position, outcome.tick, False))
        elif isinstance(outcome, Proceed) and task.chained:
            following = task.position + 1
            chained = following + 1 < len(task.plan.links)
            self._after(0, _Link(task.plan, following, task.plan.links[following].tick, chained))

    def _collect(self) -> None:
        """The chains and stops sent since the last look, due at once."""
        for plan in self.queue.chains[self._chains :]:
            self._after(0, _Link(plan, 0, plan.links[0].tick, len(plan.links) > 1))
        self._chains = len(self.queue.chains)
        for run_id, index in self.queue.stops[self._stops :]:
            self._after(0, _Stop(run_id, index))
        self._stops = len(self.queue.stops)

    def _after(self, seconds: float, task: _Task) -> None:
        due = self.clock.now + timedelta(seconds=seconds)
        heapq.heappush(self._due, (due, next(self._order), task))


def age_turns(settings: Settings, seconds: float) -> None:
    """Every scripted turn behaves as if it had started ``seconds`` earlier."""
    with session_scope(store_url(settings)) as session:
        for key, started in session.execute(select(TURNS.c.key, TURNS.c.started_at)).all():
            if started is not None:
                session.execute(
                    update(TURNS)
                    .where(TURNS.c.key == key)
                    .values(started_at=started - timedelta(seconds=seconds))
                )
