"""The faults, injected one at a time while the population runs.

Kinds (each names where it strikes; see ``docs/reliability.md``):

* ``kill_start``: SIGKILL the worker whose step is starting its provider turn (caught in the
  turn's ``INSERT INTO scripted_turns``, after the start claim committed and before the turn
  is recorded);
* ``kill_transition``: SIGKILL the worker that is writing a status transition (caught in the
  journal row its trigger writes, inside the transition's statement and its transaction,
  before commit); the caught run's committed status rotates over queued, running, waiting,
  parked and cancelling, so each kind of transition is hit;
* ``kill_effect``: SIGKILL the worker while a post-step effect runs (the checkpoint insert);

A trap matches the statement anywhere in its text (``%INSERT INTO scripted_turns%``): the
engine's writes on PostgreSQL open with a ``WITH`` (data-modifying CTEs), and a pattern
anchored at ``INSERT`` would catch nothing. The journal is written by the status triggers
(``core/status_triggers.py``), so a transition's statement never names ``run_events``: the
traps on it take any worker statement blocked on their lock (:data:`JOURNALLED`).
* ``kill_cancel``: a graceful cancel is requested, and the worker applying it is killed while it
  cancels the provider turn;
* ``kill_countdown``: SIGKILL the worker holding a step's countdown (ETA) message, found with
  ``celery inspect scheduled``;
* ``kill_timeout``: the same, for a step whose timeout is a few seconds away: the step timeout
  is then the transition the engine owes the run;
* ``kill_random``: SIGKILL a worker at a random moment;
* ``stop_zombie``: SIGSTOP a worker that is in the middle of a (slow) poll for longer than the
  heartbeat timeout, then SIGCONT: it wakes and tries to write;
* ``stop_locked``: the same, but the worker is stopped inside a transition's transaction, so it
  holds the run's row lock while it sleeps;
* ``broker_restart``: the broker loses its connections and every queued message;
* ``pg_drop``: every connection to the chaos database is terminated;
* ``net_cut``, ``net_oneway``, ``net_slow``, ``beat_cut``: a worker or the beat in a network
  namespace, its link cut both ways, one way, or slowed (:mod:`chaos.partitions`).

Each kill is followed by a restart of the worker, each stop by a SIGCONT, and the next fault
waits until the fleet is whole again: the engine's promises assume a fleet that comes back.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from chaos.driver import Driver
from chaos.fleet import WORKERS, Fleet
from chaos.partitions import PARTITION_KINDS, Partitions
from chaos.population import RunPlan
from chaos.services import ChaosDatabase
from chaos.traps import Caught, Trap

KINDS = (
    "kill_start",
    "kill_transition",
    "kill_effect",
    "kill_cancel",
    "kill_countdown",
    "kill_timeout",
    "kill_random",
    "stop_zombie",
    "stop_locked",
    "broker_restart",
    "pg_drop",
    *PARTITION_KINDS,
)

#: Seconds a client is given to reconnect once the restarted broker answers.
RECONNECT = 2.0

#: What the traps on ``run_events`` catch: any worker statement waiting on their lock, that is
#: a status change whose trigger writes its journal row (a run's, a step's, a new run's); the
#: statement itself names ``runs`` or ``steps``, never ``run_events``.
JOURNALLED = "%"

#: The committed run statuses the transition trap rotates over.
TRANSITION_SOURCES = ("running", "waiting", "queued", "parked", "cancelling")

_LIVE = ("queued", "running", "waiting", "parked", "cancelling")


@dataclass
class Fault:
    """One injected fault (or one that found no target: ``injected`` false)."""

    kind: str
    at: float
    injected: bool = False
    victim: str | None = None
    runs: list[str] = field(default_factory=list)
    detail: str = ""
    #: When a stop ended, a partition healed or a broker answered again; for a trapped kill,
    #: when the trap let the statement it caught go.
    until: float | None = None
    outage: tuple[float, float] | None = None
    healed: float | None = None

    def own(self, *runs: str) -> None:
        """Count ``runs`` as this fault's too, after those it has, each once."""
        self.runs = list(dict.fromkeys([*self.runs, *runs]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at": self.at,
            "injected": self.injected,
            "victim": self.victim,
            "runs": self.runs,
            "detail": self.detail,
            "until": self.until,
            "outage": list(self.outage) if self.outage else None,
            "healed": self.healed,
        }


class Injector:
    """Runs the fault plan against the fleet, the broker and the database."""

    def __init__(
        self,
        fleet: Fleet,
        database: ChaosDatabase,
        broker: Any,
        driver: Driver,
        plans: list[RunPlan],
        rng: random.Random,
        *,
        heartbeat_timeout: float,
        lock_engine: Engine,
        observer: Engine,
    ) -> None:
        self.fleet = fleet
        self.database = database
        self.broker = broker
        self.driver = driver
        self.plans = {plan.label: plan for plan in plans}
        self.rng = rng
        self.heartbeat_timeout = heartbeat_timeout
        self.lock_engine = lock_engine
        self.observer = observer
        #: The partition faults' harness, set by the runner once the injector exists.
        self.partitions: Partitions | None = None
        self.faults: list[Fault] = []
        self.holds: list[tuple[float, float]] = []
        self.transitions = 0

    # -- the plan ---------------------------------------------------------------------------
    def run(self, plan: list[str], until: float, stop: threading.Event) -> None:
        """Inject ``plan`` in order, one at a time, until ``until`` (wall clock). A fault that
        found no target is tried again two faults later, twice at most."""
        queue = deque(plan)
        retries: Counter[str] = Counter()
        while queue and not stop.is_set() and time.time() < until:
            kind = queue.popleft()
            fault = Fault(kind, time.time())
            owner = self.partitions if kind in PARTITION_KINDS else self
            try:
                getattr(owner, kind)(fault)
            except Exception as exc:  # a fault that could not be applied is reported, not fatal
                fault.detail = f"{fault.detail} error: {type(exc).__name__}: {exc}"[:500]
            self.faults.append(fault)
            self._heal(fault)
            if not fault.injected and retries[kind] < 2 and "skipped" not in fault.detail:
                retries[kind] += 1
                queue.insert(min(2, len(queue)), kind)
            if stop.wait(self.rng.uniform(1.0, 3.0)):
                return

    def _heal(self, fault: Fault) -> None:
        """Bring every worker back (restart a dead one, continue a stopped one)."""
        for name in WORKERS:
            if name in self.fleet.stopped:
                self.fleet.cont(name)
        self.fleet.supervise()
        for name in WORKERS:
            if self.fleet.workers[name].proc.poll() is not None:
                self.fleet.restart(name)
        fault.healed = time.time()

    # -- helpers ----------------------------------------------------------------------------
    def _rows(self, sql: str, **params: Any) -> list[Any]:
        with self.observer.connect() as connection:
            return list(connection.execute(text(sql), params).all())

    def _held_by(self, worker: str) -> list[str]:
        """Live runs whose current step last executed on ``worker``."""
        pids = self.fleet.members(worker)
        rows = self._rows(
            "SELECT r.id FROM runs r JOIN steps s ON s.run_id = r.id AND s.index = r.current_step "
            "WHERE r.status = ANY(:live) AND s.worker_pid = ANY(:pids)",
            live=list(_LIVE),
            pids=pids,
        )
        return [str(row.id) for row in rows]

    def _kill(self, fault: Fault, worker: str, runs: list[str]) -> None:
        held = self._held_by(worker)
        fault.at = self.fleet.kill(worker)
        fault.injected = True
        fault.victim = worker
        fault.own(*runs, *held)

    def _trap(
        self,
        fault: Fault,
        table: str,
        pattern: str,
        act: Callable[[Caught], None],
        *,
        timeout: float = 6.0,
        accept: Callable[[Caught], bool] = lambda _: True,
        settle: float = 0.0,
        before: Callable[[], None] | None = None,
    ) -> None:
        held_from = time.time()
        try:
            with Trap(self.lock_engine, self.observer, table, pattern) as trap:
                if not trap.armed:
                    fault.detail = f"could not lock {table}"
                    return
                if before is not None:
                    before()
                caught = trap.wait(
                    self.fleet, self.database.row_locks, timeout, accept, settle=settle
                )
                if caught is None:
                    fault.detail = f"no worker wrote {table} within {timeout}s"
                    return
                fault.detail = f"caught {caught.worker} child {caught.child_pid}: {caught.query}"
                act(caught)
        finally:
            # While the trap holds the table, every writer of it waits: that is the harness,
            # not the engine, and the audit accounts for it like an outage.
            released = time.time()
            self.holds.append((held_from, released))
            if fault.injected and fault.kind.startswith("kill"):
                # The caught statement runs when the table is let go, after the kill, and
                # PostgreSQL stamps it then (``statement_timestamp()`` of an extended-protocol
                # statement that waited on a lock): its rows carry times up to here.
                fault.until = released

    # -- kills ------------------------------------------------------------------------------
    def kill_start(self, fault: Fault) -> None:
        self._trap(
            fault,
            "scripted_turns",
            "%INSERT INTO scripted_turns%",
            lambda c: self._kill(fault, c.worker, c.run_ids),
        )

    def kill_transition(self, fault: Fault) -> None:
        wanted = TRANSITION_SOURCES[self.transitions % len(TRANSITION_SOURCES)]
        self.transitions += 1

        def act(caught: Caught) -> None:
            statuses = ",".join(status for _, status in caught.runs) or "?"
            self._kill(fault, caught.worker, caught.run_ids)
            fault.detail += f" (run was {statuses}; aimed at {wanted})"

        self._trap(
            fault,
            "run_events",
            JOURNALLED,
            act,
            timeout=3.0,
            accept=lambda c: any(status == wanted for _, status in c.runs),
            settle=1.5,
        )

    def kill_effect(self, fault: Fault) -> None:
        self._trap(
            fault,
            "checkpoints",
            "%INSERT INTO checkpoints%",
            lambda c: self._kill(fault, c.worker, c.run_ids),
            timeout=6.0,
        )

    def kill_cancel(self, fault: Fault) -> None:
        target = self._pick_running(
            ("slow_poll", "long_countdown", "complete", "multi_step")
        ) or self._pick_running(None)
        if target is None:
            fault.detail = "no running run to cancel"
            return
        run_id, owner = target

        def request() -> None:
            self.driver.cancel_later(run_id, owner)

        self._trap(
            fault,
            "scripted_turns",
            "UPDATE scripted_turns SET cancel_requested_at%",
            lambda c: self._kill(fault, c.worker, [run_id, *c.run_ids]),
            timeout=8.0,
            before=request,
        )

    def kill_countdown(self, fault: Fault) -> None:
        self._kill_holder(
            fault,
            "CAST(r.workflow -> 'steps' -> r.current_step ->> 'poll_interval' AS float) >= 1",
        )

    def kill_timeout(self, fault: Fault) -> None:
        self._kill_holder(
            fault,
            "s.started_at + make_interval(secs => CAST(r.workflow -> 'steps' -> r.current_step "
            "->> 'timeout' AS float)) - clock_timestamp() "
            "BETWEEN interval '1 second' AND interval '6 seconds'",
        )

    def _kill_holder(self, fault: Fault, condition: str) -> None:
        """SIGKILL the worker holding the countdown (ETA) message of a run that matches."""
        candidates = self._rows(
            "SELECT r.id FROM runs r JOIN steps s ON s.run_id = r.id AND s.index = r.current_step "
            "WHERE r.status = 'running' AND s.polls >= 2 AND r.cancel_requested_at IS NULL "
            f"AND {condition}"
        )
        if not candidates:
            fault.detail = "no candidate run waiting on a countdown"
            return
        wanted = {str(row.id) for row in candidates}
        app = self.driver.dispatcher.app
        scheduled = app.control.inspect(timeout=1.0).scheduled() or {}
        for hostname, entries in scheduled.items():
            worker = hostname.split("-", 1)[0]
            for entry in entries or []:
                args = entry.get("request", {}).get("args") or []
                if args and args[0] in wanted and worker in self.fleet.workers:
                    fault.detail = f"{worker} holds the countdown of {args[0]} (eta {entry['eta']})"
                    self._kill(fault, worker, [str(args[0])])
                    return
        fault.detail = "no worker reported a countdown of a candidate run"

    def kill_random(self, fault: Fault) -> None:
        time.sleep(self.rng.uniform(0.0, 2.0))
        worker = self.rng.choice(WORKERS)
        fault.detail = "at a random moment"
        self._kill(fault, worker, [])

    # -- stops ------------------------------------------------------------------------------
    def _zombie(self, fault: Fault, worker: str, runs: list[str]) -> None:
        held = self._held_by(worker)
        fault.at = self.fleet.stop(worker)
        fault.injected = True
        fault.victim = worker
        fault.own(*runs, *held)

    def _wake(self, fault: Fault) -> None:
        time.sleep(max(0.0, fault.at + self.heartbeat_timeout + 5.0 - time.time()))
        assert fault.victim is not None
        fault.until = self.fleet.cont(fault.victim)

    def stop_zombie(self, fault: Fault) -> None:
        """Prefer a worker in the middle of a slow status call; else one that ran a step last."""
        rows = self._rows(
            "SELECT r.id, s.worker_pid, r.workflow_name FROM runs r "
            "JOIN steps s ON s.run_id = r.id AND s.index = r.current_step "
            "WHERE r.status = 'running' AND s.polls >= 2 "
            "ORDER BY (r.workflow_name = 'slow_poll') DESC, s.updated_at DESC"
        )
        for row in rows:
            worker = self.fleet.owner_of(row.worker_pid)
            if worker is not None:
                what = "a slow status call" if row.workflow_name == "slow_poll" else "a step"
                fault.detail = f"{worker} was running {what} of {row.id}"
                self._zombie(fault, worker, [str(row.id)])
                self._wake(fault)
                return
        fault.detail = "no step running on a worker"

    def stop_locked(self, fault: Fault) -> None:
        self._trap(
            fault,
            "run_events",
            JOURNALLED,
            lambda c: self._zombie(fault, c.worker, c.run_ids),
            timeout=4.0,
        )
        if fault.injected:
            self._wake(fault)

    # -- services ---------------------------------------------------------------------------
    def broker_restart(self, fault: Fault) -> None:
        if self.broker is None:
            fault.detail = "skipped: shared broker, not restartable safely"
            return
        fault.runs = self.live_runs()
        fault.at = time.time()
        self.broker.restart()
        fault.injected = True
        back = time.time()
        fault.until = back
        fault.detail = "broker restarted; queued messages lost"
        # The broker is unreachable from the kill until it answers again; clients get
        # RECONNECT seconds more. Whatever the fleet does after that is the fleet's.
        fault.outage = (fault.at, back + RECONNECT)
        crashes = len(self.fleet.crashes)
        swept = self._next_sweep_after(back, timeout=15.0)
        new = self.fleet.crashes[crashes:]
        if new:
            fault.detail += "; workers crashed: " + "; ".join(
                f"{name} exit {code}: {line}" for _, name, code, line in new
            )
        fault.detail += f"; first sweeper pass {swept - back:.1f}s after the broker was back"

    def pg_drop(self, fault: Fault) -> None:
        fault.runs = self.live_runs()
        fault.at = time.time()
        killed = self.database.terminate_connections()
        fault.injected = True
        fault.detail = f"terminated {killed} connections (simulated PostgreSQL restart)"

    def live_runs(self) -> list[str]:
        """Live runs not parked for a human: what a fleet-wide fault can strike."""
        rows = self._rows(
            "SELECT id FROM runs WHERE status = ANY(:live) "
            "AND NOT (status = 'parked' AND park_reason = 'human')",
            live=list(_LIVE),
        )
        return [str(row.id) for row in rows]

    def _next_sweep_after(self, moment: float, timeout: float = 60.0) -> float:
        """When the first sweeper pass after ``moment`` was stamped (the fleet works again)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.fleet.supervise()
            try:
                rows = self._rows(
                    "SELECT extract(epoch FROM last_pass_at) AS epoch FROM sweeper_beats"
                )
            except Exception:
                rows = []
            if rows and float(rows[0].epoch) > moment:
                return time.time()
            time.sleep(0.2)
        return time.time()

    def _pick_running(self, scenarios: tuple[str, ...] | None) -> tuple[str, str] | None:
        """A running run whose turn has started (of ``scenarios``, or any)."""
        rows = self._rows(
            "SELECT r.id, r.owner FROM runs r "
            "JOIN steps s ON s.run_id = r.id AND s.index = r.current_step "
            "WHERE r.status = 'running' AND r.cancel_requested_at IS NULL "
            "AND (CAST(:any AS boolean) OR r.workflow_name = ANY(:names)) "
            "AND s.provider_run_id IS NOT NULL",
            any=scenarios is None,
            names=list(scenarios or ()),
        )
        if not rows:
            return None
        row = self.rng.choice(rows)
        return str(row.id), str(row.owner)


#: Faults that need a particular run in a particular state go first, while the population is
#: in full flow; fleet-wide ones can strike at any time.
TARGETED = tuple(
    kind for kind in KINDS if kind not in ("kill_random", "broker_restart", "pg_drop", "beat_cut")
)


def fault_plan(rng: random.Random, count: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """``count`` faults of ``kinds``: each once (fleet-wide ones among the targeted ones, none
    first), then drawn at random."""
    plan = [kind for kind in kinds if kind in TARGETED]
    rng.shuffle(plan)
    for kind in (kind for kind in kinds if kind not in TARGETED):
        plan.insert(rng.randint(1, max(1, len(plan) - 1)), kind)
    while len(plan) < count:
        plan.append(rng.choice(kinds))
    return plan[:count] if count >= len(kinds) else plan
