"""Where a step execution's time goes: statements, transactions, round trips, CPU hot spots.

Runs in the benchmark's own process against the stack's database, calling
``Stepper.advance`` directly (no Celery, no queue: ``Executor(settings, None)``), so every
statement can be counted (``bench.counting``: grouped by transaction, the scripted provider's
apart) and attributed to one execution phase:

* ``start``: the first execution (claim, render, start the provider turn);
* ``poll``: an execution that finds the turn still running;
* ``finish``: the execution that finds it finished, runs the effects and completes the step.

``instant_steps`` drives every step of a run of instant steps (the turn finished when its
start returns) the way the worker does: ``chained`` is false for the last link of a chain
segment (``chains.SEGMENT_LINKS``), which then arms the next segment. It counts executions,
statements and transactions per step.

The selectin experiment re-runs the same executions with ``Run.steps`` switched to
``lazy="select"`` *in this process only*, to price a suggested change (a control once the
model loads it so).
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bench import counting, engine, stats
from bench.counting import Counts
from bench.stack import Stack
from orchestration.core.db import utcnow
from orchestration.core.models import Run
from orchestration.core.settings import Settings
from orchestration.execution import Poll, Proceed, Stepper
from orchestration.runs import concurrency, launching
from orchestration.runs.chains import SEGMENT_LINKS
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator


def _launch(settings: Settings, flow: dict[str, Any]) -> str:
    """Write a run (no broker: its chain is not sent)."""
    return launching.launch(
        Executor(settings, None),
        settings,
        flow,
        None,
        owner="bench-profile",
        request_id=uuid.uuid4().hex,
        concurrency_key=None,
        on_conflict=concurrency.OnConflict.REJECT,
        now=utcnow(),
    )


def _stepper(settings: Settings) -> Stepper:
    return Stepper(settings, Executor(settings, None), worker="bench", pid=0)


def _drive(
    settings: Settings, counts: Counts, links: int, steps_driven: int
) -> list[dict[str, Any]]:
    """Launch a ``links``-step run (no broker) and drive its first steps by hand."""
    flow = engine.workflow(
        "profile", links, states=[["running", 0.08], ["completed"]], poll_interval=0.01
    )
    run_id = _launch(settings, flow)
    stepper = _stepper(settings)
    samples: list[dict[str, Any]] = []
    for index in range(min(steps_driven, links)):
        tick = 0
        phase = "start"
        while True:
            with counts.counting() as sample:
                outcome = stepper.advance(run_id, index, tick)
            sample["phase"] = "finish" if isinstance(outcome, Proceed) else phase
            sample["links"] = links
            samples.append(sample)
            if not isinstance(outcome, Poll):
                break
            tick, phase = outcome.tick, "poll"
            time.sleep(0.012)
    return samples


def instant_steps(stack: Stack, links: int) -> dict[str, Any]:
    """Drive every step of a ``links``-step run of instant steps as the worker would; the
    executions, statements and transactions each step took."""
    settings = stack.settings
    counts = Counts(settings.database_url)
    warm = _launch(settings, engine.workflow("warm", 2, states=[["completed"]], poll_interval=0.01))
    _stepper(settings).advance(warm, 0, 0)
    flow = engine.workflow("instant", links, states=[["completed"]], poll_interval=0.01)
    run_id = _launch(settings, flow)
    stepper = _stepper(settings)
    steps: list[dict[str, Any]] = []
    for index in range(links):
        chained = index % SEGMENT_LINKS != SEGMENT_LINKS - 1 and index < links - 1
        executions: list[dict[str, Any]] = []
        tick = 0
        while len(executions) < 50:
            with counts.counting() as sample:
                outcome = stepper.advance(run_id, index, tick, chained=chained)
            executions.append(sample)
            if not isinstance(outcome, Poll):
                break
            tick = outcome.tick
        if not isinstance(outcome, Proceed):
            raise RuntimeError(f"instant step {index} ended {outcome!r}")
        total = counting.add(executions)
        total["segment_end"] = not chained
        steps.append(total)
    return counting.summarise_steps(steps, links)


@contextlib.contextmanager
def _lazy_select() -> Iterator[None]:
    """``Run.steps`` loaded on access instead of with every ``Run`` (this process only)."""
    prop = Run.__mapper__.relationships["steps"]
    saved = (prop.strategy, prop.strategy_key, prop.lazy)
    prop.lazy = "select"
    prop.strategy_key = (("lazy", "select"),)
    prop.strategy = prop._get_strategy(prop.strategy_key)
    try:
        yield
    finally:
        prop.strategy, prop.strategy_key, prop.lazy = saved


def statements_per_execution(stack: Stack, sizes: list[int]) -> dict[str, Any]:
    """Statements and round trips per execution phase, for runs of each size in ``sizes``;
    and the same with ``Run.steps`` lazily loaded."""
    counts = Counts(stack.settings.database_url)
    _drive(stack.settings, counts, 2, 1)  # warm caches and the pool
    result: dict[str, Any] = {"as_is": {}, "steps_lazy_select": {}}
    for links in sizes:
        result["as_is"][str(links)] = counting.summarise(_drive(stack.settings, counts, links, 3))
    with _lazy_select():
        for links in sizes:
            samples = _drive(stack.settings, counts, links, 3)
            result["steps_lazy_select"][str(links)] = counting.summarise(samples)
    return result


def launch_statements(stack: Stack, sizes: list[int]) -> dict[str, Any]:
    """Statements and round trips of one ``Orchestrator.launch`` (with ``request_id``, no
    broker), for workflows of each size in ``sizes``."""
    counts = Counts(stack.settings.database_url)
    orch = Orchestrator(stack.settings, None)
    out: dict[str, Any] = {}
    for links in sizes:
        flow = engine.workflow("launch-count", links, states=[["completed"]], poll_interval=1.0)
        orch.launch(flow, owner="bench-count", request_id=uuid.uuid4().hex)  # warm
        samples = []
        for _ in range(3):
            with counts.counting() as sample:
                orch.launch(flow, owner="bench-count", request_id=uuid.uuid4().hex)
            samples.append(sample)
        out[str(links)] = {
            key: stats.median([float(s[key]) for s in samples])
            for key in ("statements", "transactions", "round_trips", "seconds")
        }
        out[str(links)]["by_kind"] = samples[-1]["by_kind"]
    return out


def cpu_profile(stack: Stack, links: int, steps_driven: int, top: int = 25) -> dict[str, Any]:
    """cProfile of driving ``steps_driven`` steps of a ``links``-step run: the top functions
    by own time and by cumulative time, as text."""
    counts = Counts(stack.settings.database_url)
    profiler = cProfile.Profile()
    profiler.enable()
    _drive(stack.settings, counts, links, steps_driven)
    profiler.disable()
    out: dict[str, Any] = {}
    for key in ("tottime", "cumulative"):
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).strip_dirs().sort_stats(key).print_stats(top)
        out[key] = buffer.getvalue()
    return out
