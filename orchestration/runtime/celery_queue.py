"""The task queue over Celery: chain segments, revokes and provider stops, sent by task name.

``orchestration/`` never imports ``tasks/``: the worker passes its own app; web apps and the
CLI get a send-only client app built from the same configuration, whose sends give up within
a second when the broker cannot be reached (:func:`celery_config.client_config`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache

from celery import Celery, chain
from kombu.exceptions import OperationalError
from kombu.utils.url import maybe_sanitize_url

from orchestration.core.errors import BrokerUnavailable
from orchestration.core.followups import ChainPlan
from orchestration.core.settings import Settings
from orchestration.runtime import celery_observing
from orchestration.runtime.celery_config import STEP_TASK, STOP_TASK, client_config, configure
from orchestration.runtime.executor import Executor


def broker_address(settings: Settings) -> str:
    """The broker's URL with its password masked, to name it in a message."""
    return str(maybe_sanitize_url(settings.broker_url))


def cause_of(exc: BaseException) -> str:
    """An error's own words on one line (its type when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@contextlib.contextmanager
def _reaching(settings: Settings) -> Iterator[None]:
    """Turn the ways a send finds no broker into one :class:`BrokerUnavailable`: kombu's
    ``OperationalError`` (a connection it could not make, refused or timed out) and the
    socket errors a transport lets through."""
    try:
        yield
    except (OperationalError, OSError) as exc:
        raise BrokerUnavailable(broker_address(settings), cause_of(exc)) from exc


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
        with _reaching(self.settings):
            if len(signatures) == 1:
                signatures[0].apply_async()
            else:
                chain(*signatures).apply_async()

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        if task_ids:
            with _reaching(self.settings):
                self.app.control.revoke(
                    task_ids, terminate=terminate, signal=self.settings.revoke_signal
                )

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        with _reaching(self.settings):
            for run_id, index in turns:
                self.app.send_task(
                    STOP_TASK,
                    args=(run_id, index),
                    queue=self.settings.queue,
                    argsrepr=f"(run={run_id}, step={index})",
                )


@lru_cache(maxsize=4)
def client_app(settings: Settings) -> Celery:
    """The send-only app of a process that is not a worker (:func:`client_config`)."""
    celery_observing.install(settings)
    app = configure(Celery("orchestration-client", set_as_current=False), settings)
    app.conf.update(client_config(app.conf))
    return app


def client_queue(settings: Settings) -> CeleryQueue:
    """A queue for processes that only send (web apps, the CLI)."""
    return CeleryQueue(client_app(settings), settings)


def client_executor(settings: Settings) -> Executor:
    """An executor sending through the configured broker."""
    return Executor(settings, client_queue(settings))
