"""Item 4: cancel latency, from the ``cancel()`` call to the terminal row and to the step's
process being gone.

Two cases, on whichever database the stack has:

* between polls: the step waits for its next poll (nothing executes), so ``cancel()`` only
  writes rows, revokes the pending message and cancels the provider turn;
* mid-poll: the step is inside a provider status call that blocks (``poll_delay``), so the
  revoke must kill the pool process running it (``terminate=True``, SIGKILL). The pid is the
  one the step's fence stamped on the row (``steps.worker_pid``); "gone" is when that process
  no longer exists (or is a zombie awaiting its parent).

The bare baseline is a read of the run's row (one round trip to the same database).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psutil
from sqlalchemy import select

from bench import engine, stats
from bench.stack import Stack
from orchestration.core.db import session_scope
from orchestration.core.models import Step


def _step_row(stack: Stack, run_id: str) -> tuple[int, int | None, str | None]:
    with session_scope(stack.settings.database_url) as session:
        row = session.execute(
            select(Step.polls, Step.worker_pid, Step.provider_run_id).where(
                Step.run_id == run_id, Step.index == 0
            )
        ).one()
    return int(row[0]), row[1], row[2]


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _watch(pid: int, out: dict[str, float], stop: threading.Event) -> None:
    while not stop.is_set():
        if _gone(pid):
            out["gone"] = time.perf_counter()
            return
        time.sleep(0.001)


def _read_row_seconds(stack: Stack, run_id: str) -> float:
    started = time.perf_counter()
    engine.status(stack.settings, run_id)
    return time.perf_counter() - started


def between_polls(stack: Stack, samples: int) -> dict[str, Any]:
    """Cancel ``samples`` runs whose step waits for its next poll."""
    orch = stack.orchestrator()
    owner = f"bench-cancel-{uuid.uuid4().hex[:6]}"
    flow = engine.workflow("cancel-idle", 1, states=[["running", 86400]], poll_interval=10)
    ids = [orch.launch(flow, owner=owner, request_id=uuid.uuid4().hex).id for _ in range(samples)]
    deadline = time.monotonic() + 60 + samples
    while any(_step_row(stack, run_id)[2] is None for run_id in ids):
        if time.monotonic() > deadline:
            raise TimeoutError("runs did not start their turns")
        time.sleep(0.2)
    to_row: list[float] = []
    baseline: list[float] = []
    for run_id in ids:
        baseline.append(_read_row_seconds(stack, run_id))
        started = time.perf_counter()
        record = orch.cancel(run_id, owner=owner)
        returned = time.perf_counter()
        if record.status != "cancelled" or engine.status(stack.settings, run_id) != "cancelled":
            raise RuntimeError(f"run {run_id} is {record.status} after cancel()")
        to_row.append(returned - started)
    return {
        "samples": samples,
        "to_terminal_row_s": stats.distribution(to_row),
        "baseline_row_read_s": stats.distribution(baseline),
        "ratio_p50": stats.ratio(stats.percentile(to_row, 50), stats.percentile(baseline, 50)),
    }


def _pool_size(stack: Stack) -> int:
    return len(stack.worker_processes()) - 1


def mid_poll(stack: Stack, samples: int, delay: float = 2.0) -> dict[str, Any]:
    """Cancel ``samples`` runs, one at a time, each while its step blocks in a status call."""
    orch = stack.orchestrator()
    owner = f"bench-cancel-{uuid.uuid4().hex[:6]}"
    flow = engine.workflow(
        "cancel-busy", 1, states=[["running", 86400]], poll_interval=0.05, poll_delay=delay
    )
    to_row: list[float] = []
    to_gone: list[float] = []
    for _ in range(samples):
        deadline = time.monotonic() + 30
        while _pool_size(stack) < 2:  # the previous kill's replacement child
            if time.monotonic() > deadline:
                raise TimeoutError("the pool did not replace its killed process")
            time.sleep(0.02)
        run_id = orch.launch(flow, owner=owner, request_id=uuid.uuid4().hex).id
        while True:
            polls, pid, _ = _step_row(stack, run_id)
            if polls >= 2 and pid is not None:  # the first poll has fenced: it is blocking
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the step never reached its first poll")
            time.sleep(0.01)
        seen: dict[str, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(pid, seen, stop), daemon=True)
        watcher.start()
        started = time.perf_counter()
        record = orch.cancel(run_id, owner=owner)
        returned = time.perf_counter()
        watcher.join(timeout=15)
        stop.set()
        if record.status != "cancelled":
            raise RuntimeError(f"run {run_id} is {record.status} after cancel()")
        to_row.append(returned - started)
        to_gone.append(seen.get("gone", float("nan")) - started)
    return {
        "samples": samples,
        "poll_delay_s": delay,
        "to_terminal_row_s": stats.distribution(to_row),
        "to_process_gone_s": stats.distribution(to_gone),
    }


def run(stack: Stack, idle_samples: int, busy_samples: int) -> dict[str, Any]:
    """Both cases on the stack's database."""
    return {
        "database": stack.settings.database_url.split(":", 1)[0],
        "between_polls": between_polls(stack, idle_samples),
        "mid_poll": mid_poll(stack, busy_samples),
    }
