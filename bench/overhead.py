"""Items 1 and 2: what a link of a chain and a poll hop cost over bare Celery.

* Step overhead: a run of ``links`` scripted steps that finish at once (``[["completed"]]``,
  ``poll_interval`` 0.01 s) against a bare chain of ``links`` no-op tasks, both timed from the
  send to the end (the run's row terminal; the bare chain's last task's ``RPUSH``). Repeats
  are taken in rounds of one of each (and, at 200 links, one chain of each peer's:
  celery-director, DBOS Transact, Prefect; ``bench.peers``), each round starting with a
  different one (``bench.rounds``), so drift on the shared machine hits them alike.
* Poll hop: one step that keeps polling with a fixed countdown against a bare task that
  ``self.retry``-s with the same countdown, the hop being the interval between two executions
  of the same task id in the worker's trace.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis
from celery import chain

from bench import engine, rounds, stats, trace
from bench.names import LOOP, MARK, NOOP
from bench.stack import Stack
from orchestration.runtime.celery_config import STEP_TASK


def bare_chain(stack: Stack, links: int, timeout: float = 120.0) -> float:
    """Seconds from sending a bare chain of ``links`` tasks to its last task running."""
    app = stack.celery()
    client = redis.Redis.from_url(stack.settings.broker_url)
    key = f"bench:chain:{uuid.uuid4().hex}"
    queue = stack.settings.queue
    signatures = [app.signature(NOOP, immutable=True, queue=queue) for _ in range(links - 1)]
    signatures.append(app.signature(MARK, args=(key,), immutable=True, queue=queue))
    started = time.time()
    chain(*signatures).apply_async()
    answer = client.blpop([key], timeout=timeout)
    if answer is None:
        raise TimeoutError(f"bare chain of {links} did not finish in {timeout}s")
    return float(answer[1]) - started


def engine_chain(stack: Stack, links: int, timeout: float = 600.0) -> tuple[float, str]:
    """Seconds from ``launch`` to the run's row being terminal, for ``links`` instant steps."""
    orch = stack.orchestrator()
    flow = engine.workflow("overhead", links, states=[["completed"]], poll_interval=0.01)
    started = time.time()
    record = orch.launch(flow, owner="bench", request_id=uuid.uuid4().hex)
    status, ended = engine.wait_terminal(stack.settings, record.id, timeout)
    if status != "completed":
        raise RuntimeError(f"engine chain ended {status}")
    return ended - started, record.id


def step_overhead(
    stack: Stack,
    links: int,
    repeats: int,
    bare_repeats: int,
    peers: Sequence[Callable[[], None]] = (),
) -> dict[str, Any]:
    """Item 1: per-link seconds, engine and bare, median over repeats taken in rounds, each
    round in a different order; ``peers`` each time one chain of a peer in every round that
    times the engine (they keep their own figures)."""
    bare_chain(stack, 10)  # warm both paths (imports, connections) before timing
    engine_chain(stack, 2)
    bare: list[float] = []
    eng: list[float] = []
    run_ids: list[str] = []

    def time_bare() -> None:
        bare.append(bare_chain(stack, links) / links)

    def time_engine() -> None:
        seconds, run_id = engine_chain(stack, links)
        eng.append(seconds / links)
        run_ids.append(run_id)

    since = time.time()
    for contestants in rounds.schedule(repeats, bare_repeats, time_bare, [time_engine, *peers]):
        for contestant in contestants:
            contestant()
    rows = trace.read(stack.trace_dir, since)
    in_engine = [row for row in rows if row.name == STEP_TASK and row.first_arg in run_ids]
    in_bare = [row for row in rows if row.name == NOOP]
    result = {
        "links": links,
        "engine_per_link_s": stats.spread(eng),
        "bare_per_link_s": stats.spread(bare),
        "ratio": stats.ratio(stats.median(eng), stats.median(bare)),
        "target_ratio": 1.5,
        "engine_executions_per_link": len(in_engine) / (links * len(run_ids)) if run_ids else 0,
        "engine_execution_busy_s": stats.distribution([row.busy for row in in_engine]),
        "bare_execution_busy_s": stats.distribution([row.busy for row in in_bare]),
    }
    return result


def _engine_hops(stack: Stack, countdown: float, hops: int) -> list[float]:
    orch = stack.orchestrator()
    flow = engine.workflow("hop", 1, states=[["running", 3600]], poll_interval=countdown)
    since = time.time()
    record = orch.launch(flow, owner="bench", request_id=uuid.uuid4().hex)
    deadline = time.monotonic() + 60 + hops * countdown * 4
    while True:
        rows = [r for r in trace.read(stack.trace_dir, since) if r.first_arg == record.id]
        # The first execution starts the turn; the next ``hops`` + 1 are polls.
        if len(rows) >= hops + 2 or time.monotonic() > deadline:
            break
        time.sleep(max(countdown, 0.05))
    orch.cancel(record.id, owner="bench")
    starts = [row.start for row in rows[1 : hops + 2]]
    return [later - earlier for earlier, later in itertools.pairwise(starts)]


def _bare_hops(stack: Stack, countdown: float, hops: int) -> list[float]:
    since = time.time()
    result = stack.celery().send_task(
        LOOP, kwargs={"countdown": countdown, "hops": hops}, queue=stack.settings.queue
    )
    deadline = time.monotonic() + 60 + hops * countdown * 4
    while time.monotonic() < deadline:
        rows = [r for r in trace.read(stack.trace_dir, since) if r.task_id == result.id]
        if len(rows) >= hops + 1:
            return trace.hops(rows, result.id)
        time.sleep(max(countdown, 0.05))
    raise TimeoutError(f"bare loop of {hops} hops did not finish")


def poll_hop(stack: Stack, countdowns: list[float], hops: int, repeats: int) -> dict[str, Any]:
    """Item 2: seconds per poll hop, engine and bare, per countdown."""
    results: dict[str, Any] = {}
    for countdown in countdowns:
        eng: list[float] = []
        bare: list[float] = []
        for _ in range(repeats):
            bare.append(stats.median(_bare_hops(stack, countdown, hops)))
            eng.append(stats.median(_engine_hops(stack, countdown, hops)))
        results[str(countdown)] = {
            "countdown_s": countdown,
            "hops": hops,
            "engine_hop_s": stats.spread(eng),
            "bare_hop_s": stats.spread(bare),
            "ratio": stats.ratio(stats.median(eng), stats.median(bare)),
            "engine_overhead_s": stats.median(eng) - countdown,
            "bare_overhead_s": stats.median(bare) - countdown,
            "target_ratio": 1.3,
        }
    return results
