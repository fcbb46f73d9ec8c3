"""The Celery configuration, built from settings: one function, used by the worker app in
``tasks/`` and by the send-only client app in :mod:`orchestration.runtime.celery_queue`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kombu
import redis.exceptions
from celery import Celery, states
from celery.backends.base import DisabledBackend
from celery.beat import PersistentScheduler
from kombu.transport import redis as kombu_redis

from orchestration.core.settings import Settings

#: Task names, one namespace. ``tasks/`` registers bodies under exactly these names.
STEP_TASK = "orchestration.step.advance"
SWEEP_TASK = "orchestration.upkeep.sweeper.sweep"
PRUNE_TASK = "orchestration.upkeep.retention.prune"
SCHEDULES_TASK = "orchestration.upkeep.schedules.fire"
#: Seconds between two retention passes (``ORCH_RETENTION_DAYS``).
PRUNE_INTERVAL = 3600.0
STOP_TASK = "orchestration.runs.turns.stop"


class NoResultBackend(DisabledBackend):  # type: ignore[misc]
    """The result backend of a deployment that keeps no results.

    A worker's ``revoke`` handler asks the app's backend for the state of each revoked task
    that is not executing, to mark it revoked (``celery.worker.control._revoke``). Celery's
    ``DisabledBackend`` raises there, so every cancel logged "Failed to mark task ... as
    revoked in backend: No result backend is configured". A backend that keeps nothing knows
    no task, which Celery calls ``PENDING`` ("waiting or unknown"); storing stays a no-op and
    fetching a result still raises.
    """

    def get_state(self, task_id: str) -> str:
        return str(states.PENDING)

    get_status = get_state


class FolderCreatingScheduler(PersistentScheduler):  # type: ignore[misc]
    """Celery's file-backed beat schedule, whose folder is created when missing: ``shelve``
    does not create it, and beat then exits logging only ``FileNotFoundError``."""

    def setup_schedule(self) -> None:
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()


#: kombu releases whose Redis transport kills a worker that holds unacknowledged messages when
#: Redis restarts (``docs/operations.md``, "Redis restarts and kombu 5.7.0"). When kombu is
#: upgraded, ``tests/integration/test_redis_restart.py`` says whether the next one needs it.
KOMBU_CRASHING_ON_REDIS_RESTART = frozenset({"5.7.0"})

_kombu_connparams: Callable[..., dict[str, Any]] = kombu_redis.Channel._connparams


@functools.wraps(_kombu_connparams)
def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
    """kombu's ``Channel._connparams``, failing with a connection error, not an
    ``AttributeError``, once the channel's broker connection was released.

    After losing the broker, Celery's consumer ``collect()``s the connection. Closing the
    consuming channel fails there (it first reads the reply of the ``BRPOP`` it was waiting
    in, from the dead socket), yet ``collect()`` detaches the transport anyway
    (``transport.client = None``). Whatever then needs a Redis client on that channel builds
    one from ``transport.client.hostname``: Celery's second close of the connection (which
    restores the unacknowledged messages), or the ack of a task that finished meanwhile.
    ``AttributeError`` on ``None`` is not a connection error, so nothing on those paths
    ignores it and the worker exits. The connection error raised here is what the same calls
    raise while Redis is down, and every caller on these paths handles it: the worker
    reconnects, and an unacknowledged message comes back after the visibility timeout (the
    step task's fencing tick makes a second delivery harmless).
    """
    transport = self.connection
    if transport is None or transport.client is None:
        raise redis.exceptions.ConnectionError(
            "the broker connection of this channel was released (Redis restarted)"
        )
    return _kombu_connparams(self, asynchronous=asynchronous)


def survive_redis_restarts() -> bool:
    """On a kombu release in :data:`KOMBU_CRASHING_ON_REDIS_RESTART`, replace the Redis
    transport's ``Channel._connparams`` with :func:`_connparams` (idempotent; it changes
    nothing while the connection is attached). Returns whether it did."""
    if kombu.__version__ not in KOMBU_CRASHING_ON_REDIS_RESTART:
        return False
    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]
    return True


def celery_config(settings: Settings) -> dict[str, Any]:
    """Settings a reliability engineer would sign (see ``docs/configuration.md``)."""
    config: dict[str, Any] = {
        "broker_url": settings.broker_url,
        # JSON only: a pickle message is refused by the worker.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        # Outputs pass between steps through the database; no result backend is needed, and
        # the one configured keeps nothing without failing a revoke (see NoResultBackend).
        "task_ignore_result": True,
        "result_backend": f"{__name__}:NoResultBackend",
        "beat_scheduler": f"{__name__}:FolderCreatingScheduler",
        # A message is acknowledged only after its task body returns; one message at a time.
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        # A worker killed mid-task does not requeue it forever; the sweeper re-arms the run.
        "task_reject_on_worker_lost": False,
        "task_default_queue": settings.queue,
        "broker_transport_options": {"visibility_timeout": settings.visibility_timeout},
        "broker_connection_retry_on_startup": True,
        "task_publish_retry": True,
        "task_publish_retry_policy": {
            "max_retries": 3,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 2.0,
        },
        # Flower sees the chain, retries and revokes.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "enable_utc": True,
        "timezone": "UTC",
        "worker_hijack_root_logger": False,
    }
    if settings.security_key:
        # Signed messages: tasks are serialized with Celery's ``auth`` serializer (JSON inside,
        # signed with the key) and only signed messages are accepted.
        config.update(
            task_serializer="auth",
            accept_content=["auth"],
            security_key=settings.security_key,
            security_certificate=settings.security_certificate,
            security_cert_store=settings.security_cert_store,
            security_digest="sha256",
        )
    return config


#: How long a client (the CLI, the Python API, the HTTP API) waits for the broker to accept a
#: connection (seconds), and how often it tries: a launch that finds no broker says so within
#: a second instead of blocking its caller (the run is saved; the sweeper sends it later).
CLIENT_CONNECT_TIMEOUT = 0.4
CLIENT_PUBLISH_RETRIES = 2


def client_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The bounds of a client's sends, over ``conf`` (:func:`celery_config`'s): a bounded
    connect (Redis takes it from the transport options, AMQP from
    ``broker_connection_timeout``) and short publish retries. A worker keeps the longer
    retries, which ride out a broker restart."""
    return {
        "broker_connection_timeout": CLIENT_CONNECT_TIMEOUT,
        "broker_transport_options": {
            **conf["broker_transport_options"],
            "socket_connect_timeout": CLIENT_CONNECT_TIMEOUT,
        },
        "task_publish_retry_policy": {
            "max_retries": CLIENT_PUBLISH_RETRIES,
            "interval_start": 0.0,
            "interval_step": 0.1,
            "interval_max": 0.2,
        },
    }


def consume_upkeep(app: Celery, settings: Settings) -> None:
    """Make a worker of ``app`` that consumes the step queue (``ORCH_QUEUE``, selected with
    ``-Q`` or by default) consume the upkeep queue (``ORCH_UPKEEP_QUEUE``) too, so that every
    deployment that runs steps runs the sweeper; a worker of other queues is left alone.

    On Redis the worker then ``BRPOP``s both lists, the one that gave the last message moved
    to the back (kombu's round-robin ``queue_order_strategy``), and it fetches only when a
    pool process is free (``worker_prefetch_multiplier`` 1, ``task_acks_late``): a waiting
    pass is taken by the next free pool process, never behind the backlog of steps. On
    RabbitMQ both consumers share the channel's prefetch (Celery's global QoS), and the
    broker delivers to whichever has a message when a process frees."""
    queues = app.amqp.queues
    if settings.queue in queues.consume_from:
        queues.select_add(settings.upkeep_queue)


def configure(app: Celery, settings: Settings) -> Celery:
    """Apply :func:`celery_config` to ``app``, keep a Redis restart from killing its workers
    (:func:`survive_redis_restarts`) and, when signing is on, register the signing serializer
    (``setup_security`` also disables every insecure serializer)."""
    app.conf.update(celery_config(settings))
    survive_redis_restarts()
    if settings.security_key:
        app.setup_security(serializer="json")
    return app
