"""Celery time limits for the tasks: a second line behind the hard bound of every call.

The first line is the provider transport's wall-clock deadline; these limits only end a task
whose body outlasts every bound it was built from (a bug, a frozen library), so that no pool
process is held forever. A task ended by its limit leaves its run to the sweeper.
"""

from __future__ import annotations

from orchestration.core.settings import MARGIN_SECONDS, Settings

#: The longest a database write may wait on a lock (SQLite's busy timeout, 30 s, is the
#: largest of the engine's own waits).
DATABASE_WAIT = 30.0
#: Seconds between the soft limit (an exception in the task) and the hard one (SIGKILL).
HARD_AFTER = 5.0


def call_limits(settings: Settings, *, calls: int, webhook: bool = False) -> tuple[float, float]:
    """Soft and hard limits of a task that makes up to ``calls`` provider calls (and the
    webhook when ``webhook``)."""
    soft = calls * settings.provider_timeout + DATABASE_WAIT + MARGIN_SECONDS
    if webhook and settings.webhook_url:
        soft += settings.webhook_timeout
    return soft, soft + HARD_AFTER


def sweep_limits(settings: Settings) -> tuple[float, float]:
    """A sweeper pass makes no provider call; it may wait on row locks, a few seconds each."""
    soft = max(60.0, 4 * settings.sweep_interval)
    return soft, soft + HARD_AFTER
