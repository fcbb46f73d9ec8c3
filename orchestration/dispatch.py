"""Sending and revoking Celery tasks by name.

``orchestration/`` never imports ``tasks/``: it sends the step chain by task name through a
:class:`Dispatcher`. The worker passes its own app; web apps get a dispatch-only client app
built from the same configuration.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from celery import Celery, chain

from orchestration.celery_config import STEP_TASK, STOP_TASK, configure
from orchestration.settings import Settings


@dataclass(frozen=True)
class Link:
    """One step task of a chain: the step index, its Celery task id and its fencing tick."""

    index: int
    task_id: str
    tick: int = 0


@dataclass(frozen=True)
class ChainPlan:
    """A chain of step tasks whose ids were chosen, and stored, before it is sent."""

    run_id: str
    links: tuple[Link, ...]

    @property
    def task_ids(self) -> list[str]:
        return [link.task_id for link in self.links]


def plan_chain(run_id: str, first_index: int, count: int, first_tick: int = 0) -> ChainPlan:
    """Choose task ids for steps ``first_index`` … ``count - 1``."""
    return ChainPlan(
        run_id,
        tuple(
            Link(index, uuid.uuid4().hex, first_tick if index == first_index else 0)
            for index in range(first_index, count)
        ),
    )


class Dispatcher(Protocol):
    """What the domain needs from the task queue."""

    def send_chain(self, plan: ChainPlan) -> None:
        """Enqueue the chain; raise on a broker failure."""

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        """Revoke the tasks in every worker (best effort; the database stays the truth)."""

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        """Enqueue the provider cancel of each ``(run_id, step index)`` turn."""


class CeleryDispatcher:
    """A :class:`Dispatcher` over a Celery app."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def send_chain(self, plan: ChainPlan) -> None:
        signatures = [
            self.app.signature(
                STEP_TASK,
                args=(plan.run_id, link.index),
                kwargs={"tick": link.tick},
                task_id=link.task_id,
                immutable=True,
                queue=self.settings.queue,
                argsrepr=f"(run={plan.run_id}, step={link.index})",
                kwargsrepr=f"{{'tick': {link.tick}}}",
            )
            for link in plan.links
        ]
        chain(*signatures).apply_async()

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        if task_ids:
            self.app.control.revoke(
                task_ids, terminate=terminate, signal=self.settings.revoke_signal
            )

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        for run_id, index in turns:
            self.app.send_task(
                STOP_TASK,
                args=(run_id, index),
                queue=self.settings.queue,
                argsrepr=f"(run={run_id}, step={index})",
            )


@lru_cache(maxsize=4)
def _client_app(settings: Settings) -> Celery:
    return configure(Celery("orchestration-client", set_as_current=False), settings)


def client_dispatcher(settings: Settings) -> CeleryDispatcher:
    """A dispatcher for processes that only send (web apps, the CLI)."""
    return CeleryDispatcher(_client_app(settings), settings)


class DuplicatingDispatcher:
    """Sends every chain twice: a duplicate delivery on purpose, over the real broker.

    For rehearsals and conformance runs (the chaos suite, the tests): a deployment must start
    one provider turn per (run, step, attempt) however often Celery delivers a step task.
    """

    def __init__(self, inner: Dispatcher) -> None:
        self.inner = inner

    def send_chain(self, plan: ChainPlan) -> None:
        self.inner.send_chain(plan)
        self.inner.send_chain(plan)

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        self.inner.revoke(task_ids, terminate=terminate)

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        self.inner.stop_turns(turns)
