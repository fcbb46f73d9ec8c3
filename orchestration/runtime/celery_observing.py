"""Celery's side of logs and traces: JSON log handlers, each task's context and span, and the
trace context in every message's headers.

Celery configures a worker's and beat's logging itself (``worker_hijack_root_logger`` is off,
so it adds its handlers beside any of the host's); ``after_setup_logger`` and
``after_setup_task_logger`` are where its handlers exist and can be given the JSON formatter.
A task's context and span open at ``task_prerun`` and close at ``task_postrun``: the chain's
next link and a poll's retry are sent in between, so their ``traceparent`` names this
execution, and Celery's own lines about the task ("retry", "succeeded") carry its run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

from celery import Task, states
from celery._state import get_current_task
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_process_shutdown,
)
from celery.utils.log import get_multiprocessing_logger

from orchestration.core.settings import Settings
from orchestration.observability import context, logs, tracing
from orchestration.runtime.celery_config import STEP_TASK, STOP_TASK

#: The span of each task that names a run: (run id, step index) are its first two arguments.
RUN_TASKS = {STEP_TASK: "step.execute", STOP_TASK: "turn.stop"}
#: The message headers that carry the trace context (W3C Trace Context).
TRACE_HEADERS = ("traceparent", "tracestate")

_open: dict[str, ExitStack] = {}


def install(settings: Settings) -> None:
    """Connect the handlers (once per process, whatever the number of apps): trace headers
    and task spans always (they do nothing while tracing is off), JSON handlers when
    ``ORCH_LOG_FORMAT=json``."""
    before_task_publish.connect(_inject, weak=False, dispatch_uid="orchestration.inject")
    task_prerun.connect(_enter, weak=False, dispatch_uid="orchestration.enter")
    task_postrun.connect(_leave, weak=False, dispatch_uid="orchestration.leave")
    worker_process_shutdown.connect(_flush, weak=False, dispatch_uid="orchestration.flush")
    if settings.log_format == "json":
        after_setup_logger.connect(_json, weak=False, dispatch_uid="orchestration.json")
        after_setup_task_logger.connect(_json, weak=False, dispatch_uid="orchestration.json-task")


def task_fields() -> Mapping[str, Any]:
    """Celery's current task, for lines logged while it runs (its own "succeeded" line too)."""
    task = get_current_task()
    request = getattr(task, "request", None)
    if task is None or request is None or not request.id:
        return {}
    fields: dict[str, Any] = {"task_id": request.id, "task_name": task.name}
    if task.name in RUN_TASKS and request.args and len(request.args) >= 2:
        fields.update(run_id=request.args[0], step_index=request.args[1])
    return fields


def _json(logger: logging.Logger, **_: Any) -> None:
    logs.use_json(logger, task_fields)
    logs.use_json(get_multiprocessing_logger(), task_fields)


def _inject(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        tracing.inject(headers)


def _enter(task_id: str, task: Task, args: tuple[Any, ...] = (), **_: Any) -> None:
    stack = ExitStack()
    name = RUN_TASKS.get(task.name)
    if name is None or len(args) < 2:
        stack.enter_context(context.scope(task_id=task_id))
    else:
        run_id, index = str(args[0]), int(args[1])
        stack.enter_context(context.scope(run_id=run_id, step_index=index, task_id=task_id))
        carrier = {
            key: value for key in TRACE_HEADERS if (value := getattr(task.request, key, None))
        }
        stack.enter_context(
            tracing.run_span(
                run_id,
                name,
                carrier=carrier,
                step_index=index,
                task_id=task_id,
                retries=task.request.retries,
            )
        )
    _open[task_id] = stack


def _leave(task_id: str, state: str | None = None, retval: Any = None, **_: Any) -> None:
    stack = _open.pop(task_id, None)
    if stack is None:
        return
    failed = state == states.FAILURE
    tracing.annotate({"celery_state": state}, error=repr(retval) if failed else None)
    stack.close()


def _flush(**_: Any) -> None:
    tracing.shutdown()
