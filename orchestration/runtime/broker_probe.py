"""What only the broker and the workers know: for the operator's fleet page, the run queue's
depth and each worker's pool; for ``explain``, whether any worker consumes the run queue and
the upkeep queue (one broadcast answers both).
Each is bounded by a short timeout and reports ``None`` when the answer did not come, so a
down broker slows a page by at most that timeout.

A broadcast costs its whole reply window whoever answers, so its answer is kept for
:data:`POOLS_FRESH` seconds: an operator refreshing a page asks the workers once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kombu.connection import Connection

from orchestration.core.settings import Settings
from orchestration.runtime.celery_queue import broker_address, client_app

LOG = logging.getLogger(__name__)
#: Longest the page waits for the broker (seconds).
TIMEOUT = 1.0
#: How long the workers' replies are collected: a broadcast waits all of it, whoever answers.
REPLIES = 0.5
#: How long a pool answer is reused (seconds).
POOLS_FRESH = 10.0

#: The last answer per broker (a broadcast reaches every node on it, whatever its queues).
_asked: dict[str, tuple[float, dict[str, dict[str, Any]] | None]] = {}
#: The last answer per broker: each node's queues.
_consuming: dict[str, tuple[float, dict[str, set[str]] | None]] = {}
_asking = threading.Lock()


def queue_depth(settings: Settings) -> int | None:
    """Messages waiting in the run queue (``ORCH_QUEUE``), or ``None`` if the broker did not
    answer. A passive declare: it creates nothing; countdown messages a worker holds are not
    counted (they are reserved, not waiting)."""
    try:
        with Connection(settings.broker_url, connect_timeout=TIMEOUT) as connection:  # type: ignore[no-untyped-call]
            connection.ensure_connection(max_retries=1, timeout=TIMEOUT)
            declared = connection.default_channel.queue_declare(queue=settings.queue, passive=True)
            return int(declared.message_count)
    except Exception as exc:
        if "NOT_FOUND" in str(exc) or type(exc).__name__ == "NotFound":
            # Redis keeps no key for an empty list, and no queue exists before a worker
            # declares it: either way nothing is waiting.
            return 0  # the page shows "unknown"; the reason goes to the log
        LOG.info("queue depth of %s unknown: %s", settings.queue, type(exc).__name__)
        return None


def pools(settings: Settings) -> tuple[dict[str, dict[str, Any]] | None, float]:
    """Each replying worker node's pool (see :func:`ask_pools`) and the answer's age in
    seconds: a fresh broadcast, or one at most :data:`POOLS_FRESH` old."""
    key = settings.broker_url
    with _asking:  # concurrent page loads share one broadcast
        asked = _asked.get(key)
        if asked is None or time.monotonic() - asked[0] > POOLS_FRESH:
            asked = _asked[key] = (time.monotonic(), ask_pools(settings))
    return asked[1], time.monotonic() - asked[0]


def ask_pools(settings: Settings) -> dict[str, dict[str, Any]] | None:
    """Each replying worker node's pool: ``{name: {pool, concurrency}}`` (Celery's ``inspect
    stats``, one broadcast), or ``None`` when no node answered in :data:`REPLIES`. What runs
    now is the database's to say (the steps each host stamps)."""
    try:
        stats = client_app(settings).control.inspect(timeout=REPLIES).stats() or {}
    except Exception as exc:
        LOG.info("worker pools unknown: %s", type(exc).__name__)
        return None
    if not stats:
        return None
    return {
        name: {
            # ``celery.concurrency.prefork:TaskPool`` -> ``prefork``
            "pool": str(info.get("pool", {}).get("implementation", ""))
            .split(":")[0]
            .rpartition(".")[2],
            "concurrency": info.get("pool", {}).get("max-concurrency"),
        }
        for name, info in sorted(stats.items())
    }


def queue_consumers(settings: Settings, queue: str | None = None) -> list[str] | None:
    """The worker nodes that answered, within :data:`REPLIES`, that they consume ``queue``
    (default the run queue, ``ORCH_QUEUE``), or ``None`` when the broker could not be
    reached. One ``inspect active_queues`` broadcast per broker, kept :data:`POOLS_FRESH`
    seconds, answers for every queue."""
    key = settings.broker_url
    with _asking:
        asked = _consuming.get(key)
        if asked is None or time.monotonic() - asked[0] > POOLS_FRESH:
            asked = _consuming[key] = (time.monotonic(), _ask_queues(settings))
    if asked[1] is None:
        return None
    wanted = queue or settings.queue
    return sorted(node for node, names in asked[1].items() if wanted in names)


def _ask_queues(settings: Settings) -> dict[str, set[str]] | None:
    try:
        replies = client_app(settings).control.inspect(timeout=REPLIES).active_queues() or {}
    except Exception as exc:
        LOG.info("queue consumers unknown: %s", type(exc).__name__)
        return None
    return {
        node: {str(queue.get("name")) for queue in queues or []} for node, queues in replies.items()
    }


def workers_doubt(settings: Settings) -> str | None:
    """What ``explain`` says when no worker can take a run's next step (``None``: a worker
    consuming the run queue answered)."""
    consumers = queue_consumers(settings)
    if consumers is None:
        return f"the broker at {broker_address(settings)} does not answer, so no worker gets it"
    if not consumers:
        return (
            f"no worker consuming queue {settings.queue!r} answered: one must run "
            "(`orchestration worker`)"
        )
    return None


def upkeep_doubt(settings: Settings) -> str | None:
    """What ``explain`` says when no worker would run the sweeper's next pass (``None``: a
    worker consuming the upkeep queue answered, or the broker did not: :func:`workers_doubt`
    says that)."""
    consumers = queue_consumers(settings, settings.upkeep_queue)
    if consumers is None or consumers:
        return None
    return (
        f"no worker consuming queue {settings.upkeep_queue!r} answered, so no sweeper pass "
        "runs: one must run (`orchestration worker`)"
    )
