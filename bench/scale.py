"""Item 3: many runs in flight on one 2-process worker, and the highest poll rate it holds.

* Saturation: ``saturation_runs`` runs polled every 0.01 s keep both pool slots busy all the
  time; the executions per second they reach is the most one worker sustains. Its baselines
  are as many bare retry loops with the same countdown, and a full queue of bare no-ops.
* At half capacity and at scale: one-step runs whose turn keeps running, each polled every
  ``interval`` seconds, against as many bare tasks that ``self.retry(countdown=interval)``;
  first as many runs as half the engine's saturated rate can poll, then ``runs``. After all
  are polling and one more interval has passed, a window is cut into sub-windows; each reports
  executions per second, poll lateness (execution start minus the ETA its message carried),
  busy pool slots (execution time summed over the window), and CPU: the worker's (main
  process and pool children) and PostgreSQL's plus Redis's as shares of the two cores, the
  worker's main process as a share of one core, and the whole machine's. Memory is the
  worker's PSS (main process plus children), idle and loaded.

A blocking wait (a task that sleeps until its turn ends) would hold one pool slot per run in
flight: ``runs`` slots. The engine holds a slot only while an execution runs.
"""

from __future__ import annotations

import itertools
import random
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import redis

from bench import engine, stats, trace
from bench.names import LOOP, NOOP
from bench.stack import Stack
from orchestration.runtime.celery_config import STEP_TASK


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _pss(processes: list[psutil.Process]) -> float:
    """Proportional set size in MiB: pages a prefork child still shares with its parent count
    once, split between them (USS would count each child's copy-on-write touches as its own,
    RSS every shared page twice)."""
    total = 0.0
    for process in processes:
        try:
            total += process.memory_full_info().pss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def _named_cpu(names: tuple[str, ...]) -> float:
    """CPU seconds of every process whose name starts with one of ``names`` (PostgreSQL
    backends, Redis): they serve the worker, and other users of the shared machine too."""
    total = 0.0
    for process in psutil.process_iter(["name", "cpu_times"]):
        name = process.info["name"] or ""
        if name.startswith(names) and process.info["cpu_times"] is not None:
            total += process.info["cpu_times"].user + process.info["cpu_times"].system
    return total


def measure_window(
    stack: Stack, name: str, window: float, parts: int, cores: int = 2
) -> dict[str, Any]:
    """Cut ``window`` seconds into ``parts`` sub-windows; per sub-window: executions of task
    ``name`` per second, lateness, busy slots, worker / service / machine CPU shares."""
    workers = stack.worker_processes()
    edges: list[tuple[float, float, float, float, float]] = []
    for index in range(parts + 1):
        if index:
            time.sleep(window / parts)
        machine = psutil.cpu_times()
        edges.append(
            (
                time.time(),
                _cpu_seconds(workers),
                _cpu_seconds(workers[:1]),
                _named_cpu(("postgres", "redis-server")),
                machine.user + machine.system + machine.nice,
            )
        )
    rows = [row for row in trace.read(stack.trace_dir, edges[0][0] - 60) if row.name == name]
    subs = []
    for (t0, w0, p0, s0, m0), (t1, w1, p1, s1, m1) in itertools.pairwise(edges):
        inside = [row for row in rows if t0 <= row.start < t1]
        late = [row.lateness for row in inside if row.lateness is not None]
        span = t1 - t0
        subs.append(
            {
                "executions_per_s": len(inside) / span,
                "lateness_p50_s": stats.percentile(late, 50),
                "lateness_p99_s": stats.percentile(late, 99),
                "busy_slots": trace.busy_slots(rows, t0, t1),
                "worker_cpu_share": (w1 - w0) / (span * cores),
                # The main process alone receives every message, keeps countdown messages in
                # its timer, hands them to the pool and acks them: one core at most.
                "worker_main_cpu_share": (p1 - p0) / span,
                "db_and_redis_cpu_share": (s1 - s0) / (span * cores),
                "machine_cpu_share": (m1 - m0) / (span * cores),
            }
        )
    pooled = [
        row.lateness
        for row in rows
        if edges[0][0] <= row.start < edges[-1][0] and row.lateness is not None
    ]
    summary: dict[str, Any] = {
        key: stats.median([sub[key] for sub in subs]) for key in subs[0] if subs
    }
    summary["lateness_pooled_s"] = stats.distribution(pooled)
    summary["subwindows"] = subs
    summary["worker_pss_mib"] = _pss(workers)
    summary["worker_main_pss_mib"] = _pss(workers[:1])
    summary["worker_main_cpu_share"] = stats.median([sub["worker_main_cpu_share"] for sub in subs])
    return summary


def _launch_many(
    stack: Stack, count: int, flow: Callable[[], dict[str, Any]], spread: float = 0.0
) -> list[str]:
    """Launch ``count`` runs from four threads, no faster than ``count`` per ``spread`` s, so
    their polls fall at different phases of the interval (as runs launched by users do)."""
    orch = stack.orchestrator()
    owner = f"bench-scale-{uuid.uuid4().hex[:6]}"
    begin = time.monotonic()

    def one(index: int) -> str:
        due = begin + spread * index / count
        time.sleep(max(0.0, due - time.monotonic()))
        return orch.launch(flow(), owner=owner, request_id=uuid.uuid4().hex).id

    # The first launch alone: building the scripted provider races between threads (its
    # ``create_all`` is not guarded; reported with the findings).
    first = one(0)
    with ThreadPoolExecutor(4) as pool:
        return [first, *pool.map(one, range(1, count))]


def _wait_polling(stack: Stack, name: str, count: int, since: float, timeout: float) -> None:
    """Wait until ``count`` distinct tasks of ``name`` have executed with an ETA (polling)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = trace.read(stack.trace_dir, since)
        polling = {row.task_id for row in rows if row.name == name and row.eta is not None}
        if len(polling) >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"only {len(polling)} of {count} {name} tasks polling after {timeout}s")


def bare_at_scale(
    stack: Stack, runs: int, interval: float, window: float, parts: int
) -> dict[str, Any]:
    """``runs`` bare retry loops every ``interval`` s, measured over ``window``; then revoked
    (one broadcast naming them all), so they stop without a tail of waiting."""
    app = stack.celery()
    since = time.time()
    until = since + 600  # a backstop; the revoke below ends them
    # The first execution of each loop is due at a random phase of the interval, as the
    # engine's runs are by their paced launches.
    ids = [
        app.send_task(
            LOOP,
            kwargs={"countdown": interval, "until": until},
            queue=stack.settings.queue,
            countdown=random.uniform(0, interval),
        ).id
        for _ in range(runs)
    ]
    _wait_polling(stack, LOOP, runs, since, timeout=3 * interval + 60)
    time.sleep(interval)
    result = measure_window(stack, LOOP, window, parts)
    app.control.revoke(ids)
    time.sleep(1.0)
    return result


def engine_at_scale(
    stack: Stack, runs: int, interval: float, window: float, parts: int, *, finite: bool
) -> dict[str, Any]:
    """``runs`` one-step runs polled every ``interval`` s, measured over ``window``. With
    ``finite`` their turns complete after the window and this waits for the runs to end;
    otherwise they poll until the caller tears the stack down."""
    since = time.time()
    # Launch (4 threads), first polls, one more interval, the window, a margin.
    end_at = since + max(runs * 0.03, interval) + 2 * interval + window + 4

    def flow() -> dict[str, Any]:
        if not finite:
            return engine.workflow("scale", 1, states=[["running", 86400]], poll_interval=interval)
        left = max(1.0, end_at - time.time())
        states: list[list[Any]] = [["running", left], ["completed"]]
        return engine.workflow("scale", 1, states=states, poll_interval=interval)

    started = time.monotonic()
    ids = _launch_many(stack, runs, flow, spread=interval)
    launch_seconds = time.monotonic() - started
    _wait_polling(stack, STEP_TASK, runs, since, timeout=runs * 0.2 + 60)
    time.sleep(interval)
    result = measure_window(stack, STEP_TASK, window, parts)
    result["launch_seconds"] = launch_seconds
    # Runs whose turn ended inside the window polled less than asked: count them.
    result["ended_before_window_end"] = runs - engine.count_live(stack.settings, ids)
    if finite:
        deadline = time.monotonic() + max(0.0, end_at - time.time()) + 120
        while engine.count_live(stack.settings, ids) and time.monotonic() < deadline:
            time.sleep(0.5)
    return result


def engine_saturation(stack: Stack, runs: int, window: float, parts: int) -> dict[str, Any]:
    """``runs`` runs polled every 0.01 s: both slots always busy."""
    since = time.time()
    warm = 3.0
    end_at = time.time() + runs * 0.1 + warm + window + 2

    def flow() -> dict[str, Any]:
        # Each turn runs until ``end_at``, then completes: the runs end by themselves.
        left = max(1.0, end_at - time.time())
        return engine.workflow(
            "sat", 1, states=[["running", left], ["completed"]], poll_interval=0.01
        )

    ids = _launch_many(stack, runs, flow)
    _wait_polling(stack, STEP_TASK, runs, since, timeout=60)
    time.sleep(warm)
    result = measure_window(stack, STEP_TASK, window, parts)
    deadline = time.monotonic() + 120
    while engine.count_live(stack.settings, ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return result


def bare_saturation(stack: Stack, runs: int, window: float, parts: int) -> dict[str, Any]:
    """``runs`` bare retry loops with a 0.01 s countdown."""
    app = stack.celery()
    since = time.time()
    until = since + 5 + window + 2
    for _ in range(runs):
        app.send_task(LOOP, kwargs={"countdown": 0.01, "until": until}, queue=stack.settings.queue)
    _wait_polling(stack, LOOP, runs, since, timeout=60)
    time.sleep(2.0)
    result = measure_window(stack, LOOP, window, parts)
    time.sleep(max(0.0, until - time.time()) + 1)
    return result


def noop_throughput(stack: Stack, count: int) -> dict[str, Any]:
    """Executions per second of a queue of ``count`` bare no-op tasks."""
    app = stack.celery()
    client = redis.Redis.from_url(stack.settings.broker_url)
    since = time.time()
    for _ in range(count):
        app.send_task(NOOP, queue=stack.settings.queue)
    deadline = time.monotonic() + 120
    while client.llen(stack.settings.queue) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    rows = [row for row in trace.read(stack.trace_dir, since) if row.name == NOOP]
    # Throughput over the middle 80 %, away from the ramp-up and the drain.
    middle = rows[len(rows) // 10 : len(rows) * 9 // 10]
    span = middle[-1].start - middle[0].start if len(middle) > 1 else float("nan")
    return {"tasks": len(rows), "executions_per_s": (len(middle) - 1) / span}


def _side_by_side(
    eng: dict[str, Any], bare: dict[str, Any], runs: int, interval: float
) -> dict[str, Any]:
    return {
        "runs": runs,
        "interval_s": interval,
        "engine": eng,
        "bare": bare,
        "ratios": {
            key: stats.ratio(eng[key], bare[key])
            for key in ("executions_per_s", "worker_cpu_share", "busy_slots")
        },
    }


def run(
    stack: Stack,
    *,
    runs: int,
    interval: float,
    window: float,
    parts: int,
    saturation_runs: int,
    saturation_window: float,
    half_window: float,
) -> dict[str, Any]:
    """Everything of item 3 on one stack, each phase ended before the next: saturation, then
    half the engine's measured capacity, then ``runs`` in flight (left polling: the caller
    tears the stack down)."""
    idle = _pss(stack.worker_processes())
    noop = noop_throughput(stack, 3000)
    bare_sat = bare_saturation(stack, saturation_runs, saturation_window, parts)
    eng_sat = engine_saturation(stack, saturation_runs, saturation_window, parts)
    # Half the rate the engine sustained, so lateness is seen below capacity as well.
    half = max(10, int(0.5 * eng_sat["executions_per_s"] * interval))
    bare_half = bare_at_scale(stack, half, interval, half_window, parts)
    eng_half = engine_at_scale(stack, half, interval, half_window, parts, finite=True)
    bare = bare_at_scale(stack, runs, interval, window, parts)
    eng = engine_at_scale(stack, runs, interval, window, parts, finite=False)
    return {
        "window_s": window,
        "half_window_s": half_window,
        "subwindows": parts,
        "worker_pss_idle_mib": idle,
        "blocking_wait_slots_needed": runs,
        "at_scale": _side_by_side(eng, bare, runs, interval),
        "at_half_capacity": _side_by_side(eng_half, bare_half, half, interval),
        "saturation": {
            "runs": saturation_runs,
            "engine_polls_per_s": eng_sat["executions_per_s"],
            "bare_retries_per_s": bare_sat["executions_per_s"],
            "bare_noops_per_s": noop["executions_per_s"],
            "ratio_to_bare_retry": stats.ratio(
                eng_sat["executions_per_s"], bare_sat["executions_per_s"]
            ),
            "ratio_to_bare_noop": stats.ratio(
                eng_sat["executions_per_s"], noop["executions_per_s"]
            ),
            "target_ratio": 0.8,
            "engine": eng_sat,
            "bare": bare_sat,
        },
    }
