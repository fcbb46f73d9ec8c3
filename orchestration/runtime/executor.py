"""The executor: one transaction per call, then what the domain asked for after commit.

Every surface (the step, stop and sweep tasks, the Python API, the HTTP API, the CLI) reaches
the domain through an :class:`Executor`. It opens the session, calls the domain, commits, and
only then carries out the :class:`~orchestration.core.followups.Followups`: sending chain
segments, revoking tasks, handing provider stops to the stop task, ending the branch runs of
an ended parent and settling the parent of an ended branch run (each in a transaction of its
own). Their errors are logged, never raised: the rows are durable, and the sweeper recovers
whatever was not done. A broker that cannot be reached is one log line, not a traceback; a
caller that reports it itself (a launch, :meth:`Executor.reporting`) gets the chains the
broker did not take instead of the log line.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import BrokerUnavailable
from orchestration.core.followups import ChainPlan, Done, Followups, Transact
from orchestration.core.settings import Settings
from orchestration.execution import branching
from orchestration.runs import turns

LOG = logging.getLogger(__name__)
T = TypeVar("T")


class TaskQueue(Protocol):
    """What the executor needs from the task queue."""

    def send_chain(self, plan: ChainPlan) -> None:
        """Enqueue the chain segment; raise :class:`BrokerUnavailable` when the broker cannot
        be reached."""

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        """Revoke the tasks in every worker (best effort; the database stays the truth)."""

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        """Enqueue the provider cancel of each ``(run_id, step index)`` turn; raise
        :class:`BrokerUnavailable` when the broker cannot be reached."""


@dataclass(frozen=True)
class Unsent:
    """A chain segment the broker did not take after its transaction committed: its run is
    saved, and the sweeper sends it once the run's heartbeat is dead and the broker is back."""

    run_id: str
    error: BrokerUnavailable


class Executor:
    """Runs domain operations against one database and one task queue (``None``: a process
    that cannot send, such as a read-only tool or a unit test; pending provider stops are
    then tried once, in this process, after the commit)."""

    def __init__(self, settings: Settings, queue: TaskQueue | None) -> None:
        self.settings = settings
        self.queue = queue

    def __call__(
        self,
        work: Callable[[Session], Done[T]],
        *,
        lock_timeout: float | None = None,
        autocommit: bool = False,
    ) -> T:
        return self._run(work, lock_timeout, autocommit, None)

    def reporting(self, unsent: list[Unsent]) -> Transact:
        """This executor as a ``Transact`` that appends to ``unsent`` each chain segment the
        broker did not take, instead of logging it: for a caller that tells its own caller
        (a launch says its run is saved but not sent)."""

        def transact(
            work: Callable[[Session], Done[T]],
            *,
            lock_timeout: float | None = None,
            autocommit: bool = False,
        ) -> T:
            return self._run(work, lock_timeout, autocommit, unsent)

        return transact

    def _run(
        self,
        work: Callable[[Session], Done[T]],
        lock_timeout: float | None,
        autocommit: bool,
        unsent: list[Unsent] | None,
    ) -> T:
        with session_scope(
            self.settings.database_url,
            lock_timeout=lock_timeout,
            autocommit=autocommit,
            together=self.settings.single_statement,
        ) as session:
            done = work(session)
        if done.then and unsent is None:
            self.carry(done.then)
        elif done.then:
            self._carry(done.then, unsent)
        return done.value

    def carry(self, then: Followups) -> None:
        """Carry out followups of a committed transaction, each on its own: one failing
        (the broker is down) does not keep the others from being tried."""
        self._carry(then, None)

    def _carry(self, then: Followups, unsent: list[Unsent] | None) -> None:
        """:meth:`carry`; with ``unsent``, the chains the broker did not take are appended
        there instead of logged."""
        queue = self.queue
        if queue is None:
            for run_id, index in then.stops:
                self._attempt(functools.partial(self._stop_here, run_id, index))
        else:
            if then.revoke:
                self._attempt(lambda: queue.revoke(list(then.revoke), terminate=True))
            if then.stops:
                self._attempt(lambda: queue.stop_turns(list(then.stops)))
            for plan in then.chains:
                try:
                    queue.send_chain(plan)
                except BrokerUnavailable as exc:
                    if unsent is None:
                        LOG.warning("run %s not sent: %s; the sweeper sends it", plan.run_id, exc)
                    else:
                        unsent.append(Unsent(plan.run_id, exc))
                except Exception:
                    LOG.exception("after-commit action failed; the sweeper will recover it")
        for run_id in then.ends:
            self._attempt(functools.partial(self._end_branch, run_id))
        for run_id, index in dict.fromkeys(then.joins):
            self._attempt(functools.partial(self._settle, run_id, index))

    def _end_branch(self, run_id: str) -> None:
        self(lambda session: branching.end_orphan(session, self.settings, run_id, utcnow()))

    def _settle(self, run_id: str, index: int) -> None:
        self(lambda session: branching.settle(session, self.settings, run_id, index, utcnow()))

    def _stop_here(self, run_id: str, index: int) -> None:
        turns.attempt(self, self.settings, run_id, index, utcnow())

    @staticmethod
    def _attempt(action: Callable[[], object]) -> None:
        try:
            action()
        except BrokerUnavailable as exc:
            LOG.warning("after-commit action not done: %s; the sweeper will recover it", exc)
        except Exception:
            LOG.exception("after-commit action failed; the sweeper will recover it")
