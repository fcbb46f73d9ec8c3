"""What a domain operation asks for once its transaction has committed.

Domain functions take a session and ``now`` and return :class:`Followups` (alone, or in a
:class:`Done` beside their value) instead of sending anything: a chain sent, a task revoked
or a provider turn stopped before the rows that explain it are durable could act on a state
that is then rolled back. One executor (``orchestration.runtime.executor``) opens the
transaction, calls the domain, commits, and carries the followups out. If the process dies
in between, the rows are durable and the sweeper does what was left undone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from sqlalchemy.orm import Session

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Link:
    """One step task of a chain: the step index, its Celery task id and its fencing tick."""

    index: int
    task_id: str
    tick: int = 0


@dataclass(frozen=True)
class ChainPlan:
    """A segment of step tasks whose ids were chosen, and stored, before it is sent."""

    run_id: str
    links: tuple[Link, ...]

    @property
    def task_ids(self) -> list[str]:
        return [link.task_id for link in self.links]


@dataclass(frozen=True)
class Followups:
    """Chains to send, task ids to revoke (``terminate=True``), ``(run_id, step index)``
    provider turns whose stop is pending on the step (``steps.turn_stop``), branch runs to end
    because their parent ended, and ``(run_id, step index)`` branching steps to settle
    because one of their branches ended (each in a transaction of its own)."""

    chains: tuple[ChainPlan, ...] = ()
    revoke: tuple[str, ...] = ()
    stops: tuple[tuple[str, int], ...] = ()
    ends: tuple[str, ...] = ()
    joins: tuple[tuple[str, int], ...] = ()

    def __add__(self, other: Followups) -> Followups:
        return Followups(
            self.chains + other.chains,
            self.revoke + other.revoke,
            self.stops + other.stops,
            self.ends + other.ends,
            self.joins + other.joins,
        )

    def __bool__(self) -> bool:
        return bool(self.chains or self.revoke or self.stops or self.ends or self.joins)


NOTHING = Followups()


@dataclass(frozen=True)
class Done(Generic[T_co]):
    """A domain operation's value and what it asks for after commit (covariant: a
    ``Done[Poll]`` is a ``Done[Outcome]``)."""

    value: T_co
    then: Followups = field(default=NOTHING)


class Transact(Protocol):
    """Run ``work`` in one transaction, commit, carry out its followups, return its value.

    ``lock_timeout`` (seconds, PostgreSQL) makes a write that waits on a locked row fail
    instead of waiting; ``autocommit`` runs ``work``'s statements with no transaction around
    them, for work that is a single statement. Operations that span provider calls (a step
    execution, a cancel, a sweeper pass) take a ``Transact`` and call it once per transaction.
    """

    def __call__(
        self,
        work: Callable[[Session], Done[T]],
        *,
        lock_timeout: float | None = None,
        autocommit: bool = False,
    ) -> T: ...
