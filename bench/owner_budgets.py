"""A plain owner's launch-to-first-step beside an owner at every per-owner budget (issue 30).

In-process on SQLite files, or on PostgreSQL with ``--database-url`` (no broker, no worker
process: the launch's chain is played by a :class:`Stepper` in this process, as
``tests/unit`` do), so the figure is the engine's own
work: the launch (its admission reads the owner's counts and limits), then the first step's
start claim (which reads the owner's live turns) and the scripted provider's start. Two
rounds, alternated ``--repeats`` times so drift on a shared machine hits both:

* ``alone``: the plain owner launches ``--launches`` runs, each timed from the launch call to
  its first step's turn started;
* ``beside``: the same, while a hostile owner sits at every budget (its active runs and live
  turns at their limits, its definitions and stored bytes too) and tries a launch between
  each of the plain owner's, every one refused.

    python -m bench.owner_budgets [--launches 200] [--repeats 3] [--database-url URL]

Prints the p50 and p99 of each round (milliseconds) and their ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
import uuid
from typing import Any

from bench.scratch import scratch_database
from orchestration.core.db import postgresql_url, session_scope, utcnow
from orchestration.core.errors import LimitExceeded
from orchestration.core.followups import ChainPlan
from orchestration.core.settings import Settings
from orchestration.execution import Stepper
from orchestration.limits import owner_budgets
from orchestration.runs import artifacts
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator

PLAIN, HOSTILE = "plain", "hostile"
#: The hostile owner's own values: small, so that it is at each of them quickly.
LIMITS = {"max_active_runs": 20, "max_live_turns": 20, "max_definitions": 20}
STORED = 1 << 20


class Kept:
    """A task queue that keeps the chains it is sent, for this process to play."""

    def __init__(self) -> None:
        self.chains: list[ChainPlan] = []

    def send_chain(self, plan: ChainPlan) -> None:
        self.chains.append(plan)

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        """Nothing runs elsewhere to revoke."""

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        """Nothing to stop: the bench's turns are left running."""


def _flow(state: str) -> dict[str, Any]:
    step = {"id": "a", "provider": "scripted", "task": "go", "with": {"states": [[state]]}}
    return {"name": f"bench-{state}", "steps": [step]}


def _first_step(settings: Settings, queue: Kept, stepper: Stepper, owner: str) -> float:
    """Launch one run as ``owner`` and start its first step; seconds taken."""
    started = time.perf_counter()
    Orchestrator(settings, queue).launch(_flow("running"), owner=owner)
    plan = queue.chains.pop()
    link = plan.links[0]
    stepper.advance(plan.run_id, link.index, link.tick)
    return time.perf_counter() - started


def _fill(settings: Settings, queue: Kept, stepper: Stepper) -> None:
    """Put the hostile owner at every budget: live runs with live turns, definitions and
    stored bytes at its own values."""
    now = utcnow()
    with session_scope(settings.database_url) as session:
        owner_budgets.set_own(session, HOSTILE, {**LIMITS, "max_stored_bytes": STORED}, now)
    for _ in range(LIMITS["max_active_runs"]):
        _first_step(settings, queue, stepper, HOSTILE)
    orch = Orchestrator(settings, queue)
    for index in range(LIMITS["max_definitions"]):
        orch.register_workflow({**_flow("running"), "name": f"d{index}"}, owner=HOSTILE)
    data = b"x" * STORED
    with session_scope(settings.database_url) as session:
        sha = hashlib.sha256(data).hexdigest()
        artifacts.store(session, settings, HOSTILE, sha, data, artifacts.TEXT, now)


def _round(settings: Settings, launches: int, hostile: bool) -> list[float]:
    queue = Kept()
    stepper = Stepper(settings, Executor(settings, queue), worker="bench", pid=1)
    orch = Orchestrator(settings, queue)
    times = []
    refused = 0
    for _ in range(launches):
        if hostile:
            try:
                orch.launch(_flow("running"), owner=HOSTILE, request_id=uuid.uuid4().hex)
            except LimitExceeded:
                refused += 1
        times.append(_first_step(settings, queue, stepper, PLAIN))
    assert not hostile or refused == launches, f"the hostile owner got {launches - refused} in"
    return times


def _quantiles(times: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return statistics.median(times) * 1000, cuts[98] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--database-url",
        help="a PostgreSQL server's URL: each round gets a new database beside it (dropped "
        "after); default SQLite files",
    )
    args = parser.parse_args()
    rounds: dict[str, list[float]] = {"alone": [], "beside": []}
    database = args.database_url or "sqlite://"
    for _ in range(args.repeats):
        for name in ("alone", "beside"):
            # A fresh database each round: the plain owner's own runs accumulate alike.
            with scratch_database(database, f"owner_budgets_{name}") as url:
                settings = Settings(
                    database_url=url,
                    broker_url="memory://",
                    max_active_runs_per_owner=args.launches + 10,
                    max_live_turns_per_owner=args.launches + 10,
                )
                if name == "beside":
                    queue = Kept()
                    _fill(settings, queue, Stepper(settings, Executor(settings, queue), pid=1))
                rounds[name].extend(_round(settings, args.launches, name == "beside"))
    alone, beside = _quantiles(rounds["alone"]), _quantiles(rounds["beside"])
    where = "PostgreSQL" if postgresql_url(database) else "SQLite"
    print(f"launch to first step, {args.launches} launches x {args.repeats} repeats, {where}")
    print(f"  alone:  p50 {alone[0]:.2f} ms  p99 {alone[1]:.2f} ms")
    print(f"  beside: p50 {beside[0]:.2f} ms  p99 {beside[1]:.2f} ms (an owner at every budget)")
    print(f"  p99 ratio beside/alone: {beside[1] / alone[1]:.2f}")


if __name__ == "__main__":
    main()
