"""Driving the engine from outside, as a caller does: workflows for the scripted provider,
and waiting for runs by reading their rows (the database is the truth)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select

from orchestration.core.db import session_scope
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_TERMINAL

_TERMINAL = [status.value for status in RUN_TERMINAL]


def workflow(
    name: str,
    steps: int,
    *,
    states: list[list[Any]],
    poll_interval: float,
    max_poll_interval: float | None = None,
    timeout: float = 3600.0,
    **options: Any,
) -> dict[str, Any]:
    """``steps`` scripted steps that each play ``states``, polled every ``poll_interval``
    (constant when ``max_poll_interval`` is left equal to it)."""
    return {
        "name": name,
        "steps": [
            {
                "id": f"s{index}",
                "provider": "scripted",
                "task": "x",
                "with": {"states": states, **options},
                "timeout": timeout,
                "poll_interval": poll_interval,
                "max_poll_interval": max_poll_interval or poll_interval,
            }
            for index in range(steps)
        ],
    }


def status(settings: Settings, run_id: str) -> str | None:
    with session_scope(settings.database_url) as session:
        return session.scalar(select(Run.status).where(Run.id == run_id))


def wait_terminal(
    settings: Settings, run_id: str, timeout: float, interval: float = 0.01
) -> tuple[str, float]:
    """Poll the run's row until it is terminal; return the status and ``time.time()`` then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = status(settings, run_id)
        if seen in _TERMINAL:
            return seen, time.time()
        time.sleep(interval)
    raise TimeoutError(f"run {run_id} not terminal after {timeout}s (last: {seen})")


def count_live(settings: Settings, run_ids: Iterable[str] | None = None) -> int:
    """Runs of ``run_ids`` (or all) that are not terminal yet."""
    query = select(func.count()).select_from(Run).where(Run.status.not_in(_TERMINAL))
    if run_ids is not None:
        query = query.where(Run.id.in_(list(run_ids)))
    with session_scope(settings.database_url) as session:
        return int(session.scalar(query) or 0)


def wait_all_terminal(settings: Settings, timeout: float) -> None:
    """Wait until no run of the stack is live."""
    deadline = time.monotonic() + timeout
    while count_live(settings):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count_live(settings)} runs still live after {timeout}s")
        time.sleep(0.25)
