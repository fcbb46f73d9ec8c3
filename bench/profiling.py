"""Where a step execution's time goes: statements, round trips, message bytes, CPU hot spots.

Runs in the benchmark's own process against the stack's database, calling
``Stepper.advance`` directly (no Celery, ``dispatcher=None``), so every statement can be
counted with a ``before_cursor_execute`` listener and attributed to one execution phase:

* ``start``: the first execution (claim, render, start the provider turn);
* ``poll``: an execution that finds the turn still running;
* ``finish``: the execution that finds it finished, runs the effects and completes the step.

Round trips to PostgreSQL per execution = statements + transactions (psycopg sends ``BEGIN``
before the first statement) + commits + pool checkouts (``pool_pre_ping`` runs ``SELECT 1``
on each). The scripted provider keeps its turns in the same database; its statements are
counted apart, since a real provider answers over HTTP instead.

The selectin experiment re-runs the same executions with ``Run.steps`` switched from
``lazy="selectin"`` to ``lazy="select"`` *in this process only*, to price a suggested change.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import pstats
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from celery import chain
from celery.signals import before_task_publish
from sqlalchemy import event

from bench import engine, stats, trace
from bench.names import LOOP
from bench.stack import Stack
from orchestration import claims, launching
from orchestration.celery_config import STEP_TASK
from orchestration.db import get_engine, utcnow
from orchestration.dispatch import client_dispatcher, plan_chain
from orchestration.models import Run
from orchestration.service import Orchestrator
from orchestration.stepper import Poll, Proceed, Stepper


class Counts:
    """SQLAlchemy events on one engine, counted while ``active``."""

    def __init__(self, url: str) -> None:
        self.engine = get_engine(url)
        self.statements: list[str] = []
        self.commits = 0
        self.begins = 0
        self.checkouts = 0
        self.active = False
        event.listen(self.engine, "before_cursor_execute", self._statement)
        event.listen(self.engine, "commit", self._commit)
        event.listen(self.engine, "begin", self._begin)
        event.listen(self.engine.pool, "checkout", self._checkout)

    def _statement(self, _c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if self.active:
            self.statements.append(statement)

    def _commit(self, *_: Any) -> None:
        self.commits += self.active

    def _begin(self, *_: Any) -> None:
        self.begins += self.active

    def _checkout(self, *_: Any) -> None:
        self.checkouts += self.active

    @contextlib.contextmanager
    def counting(self) -> Iterator[dict[str, Any]]:
        self.statements, self.commits, self.begins, self.checkouts = [], 0, 0, 0
        result: dict[str, Any] = {}
        self.active = True
        started = time.perf_counter()
        try:
            yield result
        finally:
            self.active = False
            result["seconds"] = time.perf_counter() - started
            provider = [s for s in self.statements if "scripted_turns" in s]
            engine_sql = [s for s in self.statements if "scripted_turns" not in s]
            kinds = Counter(s.split(None, 1)[0].upper() for s in engine_sql)
            result.update(
                statements=len(engine_sql),
                provider_statements=len(provider),
                by_kind=dict(kinds),
                step_selects=sum(1 for s in engine_sql if "FROM steps" in s),
                transactions=self.begins,
                commits=self.commits,
                checkouts=self.checkouts,
                round_trips=len(self.statements) + self.begins + self.commits + self.checkouts,
            )


def _drive(settings: Any, counts: Counts, links: int, steps_driven: int) -> list[dict[str, Any]]:
    """Launch a ``links``-step run (no broker) and drive its first steps by hand."""
    flow = engine.workflow(
        "profile", links, states=[["running", 0.08], ["completed"]], poll_interval=0.01
    )
    run_id = launching.launch(
        settings, None, flow, None, owner="bench-profile", request_id=uuid.uuid4().hex,
        concurrency_key=None, on_conflict=claims.OnConflict.REJECT, now=utcnow(),
    )  # fmt: skip
    stepper = Stepper(settings, None, worker="bench", pid=0)
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


def _summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in ("start", "poll", "finish"):
        rows = [s for s in samples if s["phase"] == phase]
        if not rows:
            continue
        out[phase] = {
            key: stats.median([float(r[key]) for r in rows])
            for key in (
                "statements",
                "provider_statements",
                "step_selects",
                "transactions",
                "commits",
                "checkouts",
                "round_trips",
                "seconds",
            )
        }
        out[phase]["by_kind"] = rows[-1]["by_kind"]
        out[phase]["samples"] = len(rows)
    return out


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
        result["as_is"][str(links)] = _summarise(_drive(stack.settings, counts, links, 3))
    with _lazy_select():
        for links in sizes:
            samples = _drive(stack.settings, counts, links, 3)
            result["steps_lazy_select"][str(links)] = _summarise(samples)
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


def message_bytes(stack: Stack, lengths: list[int]) -> dict[str, int]:
    """JSON bytes of the message that carries the first link of a step chain of each length
    (what every poll of that step re-publishes), sent to a queue nobody reads."""
    app = client_dispatcher(stack.settings).app
    sizes: dict[str, int] = {}
    seen: list[int] = []

    def measure(body: Any = None, **_: Any) -> None:
        seen.append(len(json.dumps(body)))

    before_task_publish.connect(measure, weak=False)
    queue = f"bench-void-{uuid.uuid4().hex[:8]}"
    try:
        for length in lengths:
            plan = plan_chain(uuid.uuid4().hex, 0, length)
            signatures = [
                app.signature(
                    STEP_TASK,
                    args=(plan.run_id, link.index),
                    kwargs={"tick": link.tick},
                    task_id=link.task_id,
                    immutable=True,
                    queue=queue,
                    argsrepr=f"(run={plan.run_id}, step={link.index})",
                    kwargsrepr=f"{{'tick': {link.tick}}}",
                )
                for link in plan.links
            ]
            seen.clear()
            chain(*signatures).apply_async()
            sizes[str(length)] = seen[0]
    finally:
        before_task_publish.disconnect(measure)
        redis.Redis.from_url(stack.settings.broker_url).delete(queue)
    return sizes


def redis_commands(stack: Stack, countdown: float = 0.1, hops: int = 10) -> dict[str, Any]:
    """Redis commands per hop (``MONITOR``), engine poll against bare retry, on the idle
    stack. MONITOR slows Redis down, so this runs apart from every timed measurement."""
    url = stack.settings.broker_url
    db = redis.Redis.from_url(url).connection_pool.connection_kwargs.get("db", 0)
    results: dict[str, Any] = {}
    for label in ("bare", "engine"):
        commands: list[str] = []
        stop = threading.Event()
        client = redis.Redis.from_url(url)

        def listen(
            client: redis.Redis = client,
            commands: list[str] = commands,
            stop: threading.Event = stop,
        ) -> None:
            with client.monitor() as monitor:  # type: ignore[no-untyped-call]
                for entry in monitor.listen():
                    if stop.is_set():
                        return
                    if entry.get("db") == db:
                        commands.append(str(entry["command"]).split(" ", 1)[0].upper())

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        time.sleep(0.3)
        since = time.time()
        if label == "bare":
            sent = stack.celery().send_task(
                LOOP, kwargs={"countdown": countdown, "hops": hops}, queue=stack.settings.queue
            )
            task_id = sent.id
        else:
            orch = stack.orchestrator()
            flow = engine.workflow("mon", 1, states=[["running", 3600]], poll_interval=countdown)
            run = orch.launch(flow, owner="bench-monitor", request_id=uuid.uuid4().hex)
            task_id = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = trace.read(stack.trace_dir, since)
            mine = [r for r in rows if (r.task_id == task_id if task_id else r.name == STEP_TASK)]
            if len(mine) >= hops + 1:
                break
            time.sleep(0.05)
        stop.set()
        redis.Redis.from_url(url).ping()  # wake the monitor so it sees ``stop``
        thread.join(timeout=5)
        if label == "engine":
            orch.cancel(run.id, owner="bench-monitor")
        kinds = Counter(commands)
        results[label] = {
            "executions": len(mine),
            "commands_per_execution": round(len(commands) / max(len(mine), 1), 1),
            "by_command": dict(kinds.most_common()),
        }
    return results


def worker_profile(stack: Stack, links: int, seconds: float) -> dict[str, Any]:
    """py-spy on the worker's pool children while a ``links``-step run executes: the share of
    samples spent in each of a few functions of interest (inclusive)."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return {"skipped": "py-spy is not installed in this venv"}
    orch = stack.orchestrator()
    flow = engine.workflow("spy", links, states=[["completed"]], poll_interval=0.01)
    run = orch.launch(flow, owner="bench-spy", request_id=uuid.uuid4().hex)
    time.sleep(1.0)
    outputs = []
    procs = []
    for child in stack.worker_processes()[1:]:
        out = stack.folder / f"py-spy-{child.pid}.txt"
        outputs.append(out)
        procs.append(
            subprocess.Popen(
                [
                    str(spy),
                    "record",
                    "-p",
                    str(child.pid),
                    "-d",
                    str(int(seconds)),
                    "-r",
                    "200",
                    "-f",
                    "raw",
                    "-o",
                    str(out),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    for proc in procs:
        proc.wait()
    stack.orchestrator().cancel(run.id, owner="bench-spy")
    return _fold(outputs)


#: Frames whose inclusive share of the worker's samples the report quotes.
FRAMES = {
    "Stepper.advance": "Stepper.advance (orchestration/stepper.py",
    "Session.get (loading a Run, and its steps if eager)": "Session.get (sqlalchemy/orm/session.py",
    "selectin load of Run.steps": "_SelectInLoader._load_for_path",
    "JSON decode": "JSONDecoder.raw_decode",
    "waiting on PostgreSQL": "Connection.wait (psycopg/connection.py",
    "Celery retry (publish)": "Task.retry (celery/app/task.py",
    "pydantic StepSpec validation": "BaseModel.model_validate",
    "scripted provider": "orchestration/providers/scripted.py",
}


def _fold(paths: list[Any]) -> dict[str, Any]:
    total = 0
    hits: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack_text, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            total += int(count)
            for label, needle in FRAMES.items():
                if needle in stack_text:
                    hits[label] += int(count)
    return {
        "samples": total,
        "share": {label: round(hits[label] / total, 3) if total else None for label in FRAMES},
    }
