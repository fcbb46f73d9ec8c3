"""The task queue over Celery: chain segments, revokes and provider stops, sent by task name.

``orchestration/`` never imports ``tasks/``: the worker passes its own app; web apps and the
CLI get a send-only client app built from the same configuration.
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery, chain

from orchestration.followups import ChainPlan
from orchestration.runtime import celery_observing
from orchestration.runtime.celery_config import STEP_TASK, STOP_TASK, configure
from orchestration.runtime.executor import Executor
from orchestration.settings import Settings


class CeleryQueue:
    """A :class:`~orchestration.runtime.executor.TaskQueue` over a Celery app."""

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
        if len(signatures) == 1:
            signatures[0].apply_async()
        else:
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
def client_app(settings: Settings) -> Celery:
    celery_observing.install(settings)
    return configure(Celery("orchestration-client", set_as_current=False), settings)


def client_queue(settings: Settings) -> CeleryQueue:
    """A queue for processes that only send (web apps, the CLI)."""
    return CeleryQueue(client_app(settings), settings)


def client_executor(settings: Settings) -> Executor:
    """An executor sending through the configured broker."""
    return Executor(settings, client_queue(settings))
