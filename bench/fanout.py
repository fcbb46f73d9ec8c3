"""Fan-out: a ``for_each`` of ``branches`` instant scripted items with ``max_concurrency``
against a bare Celery ``group`` of as many no-op tasks, on the same broker and worker.

* Engine: one run of one ``for_each`` step, timed from ``launch`` to the parent run's row being
  terminal. Every item is a branch run of its own (rows written, a chain segment sent, its end
  settled against the parent under the parent's lock), admitted ``concurrency`` at a time.
* Bare: a ``group`` of ``branches`` no-op tasks sent at once, timed to the end of the last one
  as the worker's trace records it: there is no result backend to wait on, and a no-op that
  reported its own end (item 1's ``mark``) would no longer be a no-op.

Repeats alternate bare and engine, so drift on the shared machine hits both. The most branch
turns running at once is not reported: an instant turn is done inside the execution that
starts it, so the overlap seen is the pool's two processes, not ``max_concurrency``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery import group

from bench import engine, stats, trace
from bench.names import NOOP
from bench.stack import Stack
from orchestration.runtime.celery_config import STEP_TASK


def workflow(concurrency: int) -> dict[str, Any]:
    """One ``for_each`` step over ``args.items`` whose every branch turn is done at once."""
    return {
        "name": "fanout",
        "steps": [
            {
                "id": "fan",
                "for_each": "{{ args.items }}",
                "max_concurrency": concurrency,
                "step": {
                    "provider": "scripted",
                    "task": "{{ item }}",
                    "poll_interval": 0.1,
                    "max_poll_interval": 0.2,
                    "with": {"states": [["completed"]]},
                },
            }
        ],
    }


def engine_fanout(
    stack: Stack, branches: int, concurrency: int, timeout: float = 600.0
) -> tuple[float, list[str]]:
    """Seconds from ``launch`` to the parent's terminal row; the parent's and branches' ids."""
    orch = stack.orchestrator()
    owner = "bench-fanout"
    started = time.time()
    record = orch.launch(
        workflow(concurrency),
        {"items": list(range(branches))},
        owner=owner,
        request_id=uuid.uuid4().hex,
    )
    status, ended = engine.wait_terminal(stack.settings, record.id, timeout)
    done = orch.get(record.id, owner=owner)
    listed = done.steps[0].branches or []
    if status != "completed" or len(listed) != branches:
        raise RuntimeError(
            f"fan-out run {record.id} ended {status} with {len(listed)} of {branches} "
            f"branches: {done.error}"
        )
    return ended - started, [record.id, *(branch["run_id"] for branch in listed)]


def bare_group(stack: Stack, tasks: int, timeout: float = 120.0) -> float:
    """Seconds from sending a group of ``tasks`` no-ops to the end of the last one."""
    app = stack.celery()
    queue = stack.settings.queue
    started = time.time()
    result = group(app.signature(NOOP, immutable=True, queue=queue) for _ in range(tasks))()
    ids = {child.id for child in result.results}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ends = [row.end for row in trace.read(stack.trace_dir, started) if row.task_id in ids]
        if len(ends) == tasks:
            return max(ends) - started
        time.sleep(0.01)
    raise TimeoutError(f"bare group of {tasks} did not finish in {timeout}s")


def run(
    stack: Stack, branches: int = 100, concurrency: int = 10, repeats: int = 5
) -> dict[str, Any]:
    """Engine and bare seconds per fan-out, medians over alternating repeats, and their ratio."""
    bare_group(stack, 10)  # warm both paths (imports, connections) before timing
    engine_fanout(stack, 4, 2)
    bare: list[float] = []
    eng: list[float] = []
    run_ids: set[str] = set()
    since = time.time()
    for _ in range(repeats):
        bare.append(bare_group(stack, branches))
        seconds, ids = engine_fanout(stack, branches, concurrency)
        eng.append(seconds)
        run_ids.update(ids)
    rows = trace.read(stack.trace_dir, since)
    executions = [row for row in rows if row.name == STEP_TASK and row.first_arg in run_ids]
    engine_median, bare_median = stats.median(eng), stats.median(bare)
    return {
        "branches": branches,
        "max_concurrency": concurrency,
        "repeats": repeats,
        "engine_s": stats.spread(eng),
        "bare_s": stats.spread(bare),
        "engine_samples_s": eng,
        "bare_samples_s": bare,
        "ratio": stats.ratio(engine_median, bare_median),
        "engine_per_branch_s": engine_median / branches,
        "bare_per_task_s": bare_median / branches,
        "engine_executions_per_branch": len(executions) / (branches * repeats),
        "engine_execution_busy_s": stats.distribution([row.busy for row in executions]),
    }
