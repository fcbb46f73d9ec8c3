"""The partition and latency faults (issue 13): a worker, or the beat, moved into the chaos
network namespace (:mod:`chaos.netns`) and its link cut, cut one way, or slowed, then healed.

Kinds:

* ``net_cut``: a third worker, ``chaos-net<n>``, runs in the namespace; once it holds a running
  step (it has just fenced it, if that happens within 8 s; else it fenced it last), its link
  is cut both ways until the sweeper has re-armed every run it held (or they ended). Then the
  database comes back while the broker stays cut, so the worker can act only on what it held
  before the cut, for :data:`LINGER` seconds: whatever it writes to a run taken over is
  counted by :mod:`chaos.fencing`. Then it is killed and the link healed.
* ``net_oneway``: the same with one direction cut, alternately what the worker sends (its
  statements never arrive) and what it receives (they arrive, their answers do not).
* ``net_slow``: the namespaced worker works over a slow, lossy link for :data:`SLOW_FOR`
  seconds, then the link heals and the worker is stopped; what it was executing then ends
  with it, so every run it wrote to during the fault is the fault's.
* ``beat_cut``: the beat is moved into the namespace and its link cut both ways for the
  heartbeat timeout plus 4 s (no sweeper pass is sent), then healed. The cut is an outage the
  audit excuses up to the heal plus :data:`~chaos.faults.RECONNECT`; after that, no run may be
  left past its deadline.

When the machine does not allow namespaces each is skipped, with the reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from chaos.fleet import Fleet
from chaos.netns import Network
from orchestration.runtime.processes import ManagedProcess, celery_argv

if TYPE_CHECKING:
    from chaos.faults import Fault

PARTITION_KINDS = ("net_cut", "net_oneway", "net_slow", "beat_cut")

#: The namespaced workers' name, and their ``application_name`` without ``chaos-``, followed by
#: the fault's number: each fault starts a worker of its own, and a write is the cut worker's
#: only if it comes from that very worker, not from the one a later fault starts (which may
#: take a stop task of a run the earlier one held). Traps only catch ``chaos-w%`` backends,
#: whose client ports they can map to a worker child.
VICTIM = "net"

#: Seconds the cut worker gets, database back and broker still cut, to try its writes.
LINGER = 6.0
#: Seconds the worker's link stays slow.
SLOW_FOR = 12.0
#: The slow link: forwarder delay and jitter (ms, each way), the ends' rate, and loss bursts
#: (mean gap, mean length, seconds): about one packet in ten sent meets a burst.
SLOW_LINK: tuple[int, int, str, tuple[float, float]] = (60, 40, "512kbit", (1.0, 0.1))


class Partitions:
    """Applies the partition kinds; ``network`` is ``None`` where namespaces are refused."""

    def __init__(
        self,
        network: Network | None,
        unavailable: str,
        fleet: Fleet,
        env: Mapping[str, str],
        database_url: Callable[[str], str],
        observer: Engine,
        live_runs: Callable[[], list[str]],
        *,
        heartbeat_timeout: float,
        broker_port: int,
        reconnect: float,
    ) -> None:
        self.network = network
        self.unavailable = unavailable
        self.fleet = fleet
        self.env = env
        self.database_url = database_url
        self.observer = observer
        self.live_runs = live_runs
        self.heartbeat_timeout = heartbeat_timeout
        self.broker_port = broker_port
        self.reconnect = reconnect
        self.started = 0
        self.oneway = 0

    # -- helpers ----------------------------------------------------------------------------
    def _net(self, fault: Fault) -> Network | None:
        if self.network is None:
            fault.detail = f"skipped: {self.unavailable}"
        return self.network

    def _rows(self, sql: str, **params: Any) -> list[Any]:
        with self.observer.connect() as connection:
            return list(connection.execute(text(sql), params).all())

    def _env(self, network: Network, victim: str) -> dict[str, str]:
        return {
            **self.env,
            "ORCH_BROKER_URL": network.url(self.env["ORCH_BROKER_URL"]),
            "ORCH_DATABASE_URL": network.url(self.database_url(f"chaos-{victim}")),
        }

    def _worker(self, network: Network) -> tuple[ManagedProcess, str]:
        """Start a namespaced worker of its own on the fleet's queue and wait until it is
        ready; the worker, and its name (:data:`VICTIM` and its number)."""
        self.started += 1
        victim = f"{VICTIM}{self.started}"
        queue = self.fleet.queue
        options = "-P prefork -c 2 --without-mingle --without-gossip -E -l INFO"
        argv = celery_argv("worker", *options.split(), "-n", f"{VICTIM}-{queue}@%h", "-Q", queue)
        log = self.fleet.folder / f"{VICTIM}-{self.started}.log"
        worker = ManagedProcess(network.command(argv), self._env(network, victim), log)
        try:
            worker.wait_for_log("ready.", timeout=90)
        except RuntimeError:
            worker.stop(timeout=1)
            raise
        return worker, victim

    @staticmethod
    def _group(pid: int) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == pid:
                        pids.append(int(entry))
                except ProcessLookupError:
                    continue
        return pids

    def _held(self, worker: ManagedProcess, timeout: float, fresh: float = 0.0) -> list[str]:
        """Running runs whose current step the worker fenced last, waiting up to ``timeout``
        for one. For the first ``fresh`` seconds, only a fence of the last 0.5 s counts (the
        execution is still in flight, most likely in a slow status call); after that, any
        (the worker may hold the step's countdown message instead)."""
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            rows = self._rows(
                "SELECT r.id FROM runs r "
                "JOIN steps s ON s.run_id = r.id AND s.index = r.current_step "
                "WHERE r.status = 'running' AND s.status = 'running' "
                "AND s.worker_pid = ANY(:pids) AND (NOT CAST(:fresh AS boolean) "
                "OR s.updated_at > clock_timestamp() - interval '0.5 seconds') "
                "ORDER BY (r.workflow_name = 'slow_poll') DESC",
                pids=self._group(worker.pid),
                fresh=waited < fresh,
            )
            if rows or waited > timeout:
                return [str(row.id) for row in rows]
            time.sleep(0.1)

    def _taken_over(
        self, runs: list[str], victim: str, since: float, timeout: float
    ) -> float | None:
        """Wait until every run in ``runs`` was re-armed, fenced by a process other than
        ``victim``, or ended; when that happened, or ``None`` on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self._rows(
                "SELECT r.id, (SELECT max(extract(epoch FROM w.at)) FROM chaos_writes w "
                "  WHERE w.run_id = r.id AND w.app <> :victim AND (w.rearm OR w.fence) "
                "  AND w.at > to_timestamp(:since)) AS taken, "
                "r.status IN ('completed', 'failed', 'cancelled', 'timed_out', 'interrupted') "
                "AS ended FROM runs r WHERE r.id = ANY(:runs)",
                victim=f"chaos-{victim}",
                since=since,
                runs=runs,
            )
            if rows and all(row.taken is not None or row.ended for row in rows):
                return max([float(row.taken) for row in rows if row.taken] or [time.time()])
            time.sleep(0.3)
        return None

    def _written_by(self, victim: str, since: float) -> list[str]:
        """The runs the namespaced worker ``victim`` wrote to since ``since`` (its own name,
        one per fault, tells its writes from those of the next fault's worker)."""
        rows = self._rows(
            "SELECT DISTINCT run_id FROM chaos_writes "
            "WHERE app = :app AND at >= to_timestamp(:since)",
            app=f"chaos-{victim}",
            since=since,
        )
        return [str(row.run_id) for row in rows]

    def _next_sweep(self, moment: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self._rows("SELECT extract(epoch FROM last_pass_at) AS at FROM sweeper_beats")
            if rows and rows[0].at is not None and float(rows[0].at) > moment:
                return time.time()
            time.sleep(0.2)
        return None

    # -- the kinds --------------------------------------------------------------------------
    def net_cut(self, fault: Fault) -> None:
        self._isolate(fault, "both")

    def net_oneway(self, fault: Fault) -> None:
        self.oneway += 1
        self._isolate(fault, "out" if self.oneway % 2 else "in")

    def _isolate(self, fault: Fault, direction: str) -> None:
        network = self._net(fault)
        if network is None:
            return
        worker, victim = self._worker(network)
        try:
            held = self._held(worker, timeout=15.0, fresh=8.0)
            if not held:
                fault.detail = "no step ran on the namespaced worker within 15s"
                return
            fault.at = time.time()
            network.cut(direction)
            fault.injected, fault.victim, fault.runs = True, victim, held
            taken = self._taken_over(held, victim, fault.at, timeout=self.heartbeat_timeout + 20.0)
            # The database comes back; the broker stays cut, so nothing new reaches the worker.
            network.cut("both", (self.broker_port,))
            fault.until = time.time()
            time.sleep(LINGER)
            fault.detail = (
                f"cut {direction} while it held {len(held)} running step(s); "
                + (
                    f"taken over {taken - fault.at:.1f}s after the cut"
                    if taken is not None
                    else "NOT all taken over"
                )
                + f"; database back for {LINGER:.0f}s with the broker cut, then killed"
            )
        finally:
            worker.stop(timeout=0)
            network.heal()

    def net_slow(self, fault: Fault) -> None:
        network = self._net(fault)
        if network is None:
            return
        worker, victim = self._worker(network)
        try:
            held = self._held(worker, timeout=8.0)
            fault.at = time.time()
            network.slow(*SLOW_LINK)
            fault.injected, fault.victim = True, victim
            time.sleep(SLOW_FOR)
            fault.own(*held, *self._held(worker, timeout=0))
            dropped = network.dropped()
            fault.detail = f"{network.state} for {SLOW_FOR:.0f}s; {dropped} packets dropped"
        finally:
            network.heal()
            worker.stop(timeout=15)
        if fault.injected:
            # The stop ends what the worker was executing: a start may have reached the
            # provider with its record lost, and be made again by another worker. Every run
            # the worker wrote to since the link slowed is the fault's, up to the stop.
            fault.own(*self._written_by(victim, fault.at))
            fault.until = time.time()

    def beat_cut(self, fault: Fault) -> None:
        network = self._net(fault)
        if network is None:
            return
        # The namespaced beat starts before the fleet's stops, and the fleet's starts again
        # before it stops: a second beat is harmless (every pass is a compare-and-set), and
        # the sweeper never pauses but for the cut.
        self.started += 1
        schedule = self.fleet.folder / f"beat-net-{self.started}"
        beat = ManagedProcess(
            network.command(celery_argv("beat", "-l", "INFO", "-s", str(schedule))),
            self._env(network, f"{VICTIM}{self.started}"),
            self.fleet.folder / f"beat-net-{self.started}.log",
        )
        try:
            beat.wait_for_log("beat: Starting", timeout=60)
            if self.fleet.beat is not None:
                self.fleet.beat.stop(timeout=5)
            self._next_sweep(time.time(), timeout=15.0)
            fault.runs = self.live_runs()
            fault.at = time.time()
            network.cut("both")
            fault.injected, fault.victim = True, "beat"
            time.sleep(self.heartbeat_timeout + 4.0)
            network.heal()
            back = time.time()
            fault.until = back
            fault.outage = (fault.at, back + self.reconnect)
            swept = self._next_sweep(back, timeout=30.0)
            fault.detail = f"beat cut both ways for {back - fault.at:.1f}s; " + (
                f"first sweeper pass {swept - back:.1f}s after the heal"
                if swept is not None
                else "NO sweeper pass within 30s of the heal"
            )
        finally:
            network.heal()
            self.fleet.start_beat()
            beat.stop(timeout=5)
