"""The executor: one transaction per call, then what the domain asked for after commit.

Every surface (the step, stop and sweep tasks, the Python API, the HTTP API, the CLI) reaches
the domain through an :class:`Executor`. It opens the session, calls the domain, commits, and
only then carries out the :class:`~orchestration.followups.Followups`: sending chain
segments, revoking tasks, handing provider stops to the stop task, ending the branch runs of
an ended parent and settling the parent of an ended branch run (each in a transaction of its
own). Their errors are logged, never raised: the rows are durable, and the sweeper recovers
whatever was not done.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session

from orchestration import turns
from orchestration.db import session_scope, utcnow
from orchestration.execution import branching
from orchestration.followups import ChainPlan, Done, Followups
from orchestration.settings import Settings

LOG = logging.getLogger(__name__)
T = TypeVar("T")


class TaskQueue(Protocol):
    """What the executor needs from the task queue."""

    def send_chain(self, plan: ChainPlan) -> None:
        """Enqueue the chain segment; raise on a broker failure."""

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        """Revoke the tasks in every worker (best effort; the database stays the truth)."""

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        """Enqueue the provider cancel of each ``(run_id, step index)`` turn."""


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
        with session_scope(
            self.settings.database_url,
            lock_timeout=lock_timeout,
            autocommit=autocommit,
            together=self.settings.single_statement,
        ) as session:
            done = work(session)
        if done.then:
            self.carry(done.then)
        return done.value

    def carry(self, then: Followups) -> None:
        """Carry out followups of a committed transaction, each on its own: one failing
        (the broker is down) does not keep the others from being tried."""
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
                self._attempt(functools.partial(queue.send_chain, plan))
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
        except Exception:
            LOG.exception("after-commit action failed; the sweeper will recover it")
