"""The processes under test: two prefork workers and one beat, killed, stopped and restarted.

Every worker is its own process group (``orchestration.runtime.processes``), so a signal reaches the
main process and its prefork children at once. Each worker connects to PostgreSQL under its
own ``application_name`` (``chaos-w1``, ``chaos-w2``), which is how a fault finds the worker
behind a database backend, and how the audit tells who wrote what.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchestration.runtime.processes import ManagedProcess, start_beat, start_worker

WORKERS = ("w1", "w2")


def app_name(worker: str) -> str:
    """The ``application_name`` a worker's database connections carry."""
    return f"chaos-{worker}"


@dataclass
class Fleet:
    """Two workers and a beat on one queue; ``env`` is the environment they share."""

    env: Mapping[str, str]
    folder: Path
    queue: str
    database_url_for: dict[str, str]
    workers: dict[str, ManagedProcess] = field(default_factory=dict)
    beat: ManagedProcess | None = None
    starts: dict[str, int] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)
    closed: bool = False
    #: Workers the harness killed (restarted by the injector); any other death is a crash.
    killed: set[str] = field(default_factory=set)
    #: Workers that died by themselves: (time, worker, exit code, last error line of its log).
    crashes: list[tuple[float, str, int | None, str]] = field(default_factory=list)

    def start(self) -> None:
        """Both workers (started side by side) and the beat."""
        with ThreadPoolExecutor(len(WORKERS)) as pool:
            list(pool.map(self.start_worker, WORKERS))
        self.start_beat()

    def start_worker(self, name: str) -> ManagedProcess:
        """Start worker ``name`` (registered at once, so a shutdown reaches it) and wait until
        it is ready. Refused once the fleet is shut down."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the fleet is shut down")
            self.starts[name] = self.starts.get(name, 0) + 1
            env = {**self.env, "ORCH_DATABASE_URL": self.database_url_for[name]}
            process = start_worker(
                env,
                self.folder / f"{name}-{self.starts[name]}.log",
                concurrency=2,
                name=f"{name}-{self.queue}",
                extra=("-Q", self.queue),
            )
            self.workers[name] = process
        process.wait_for_log("ready.", timeout=90)
        with self.lock:
            self.killed.discard(name)
        return process

    def start_beat(self) -> None:
        self.beat = start_beat(
            self.env, self.folder / "beat.log", self.folder / f"beat-schedule-{self.queue}"
        )
        self.beat.wait_for_log("beat: Starting", timeout=60)

    def kill(self, name: str) -> float:
        """SIGKILL the worker's whole process group; return when it is gone."""
        process = self.workers[name]
        with self.lock:
            self.killed.add(name)
            self.stopped.discard(name)
        process.signal(signal.SIGKILL)
        process.proc.wait(10)
        return time.time()

    def restart(self, name: str) -> None:
        """Start a fresh worker under the same name after a kill."""
        with self.lock:
            old = self.workers[name]
            if old.proc.poll() is None:
                return  # another thread already brought it back
            old.stop(timeout=1)
            self.start_worker(name)

    def supervise(self) -> list[str]:
        """Restart every worker that died by itself (as systemd's ``Restart=always`` would),
        recording the crash; return the names restarted."""
        revived: list[str] = []
        with self.lock:
            if self.closed:
                return revived
            for name, process in list(self.workers.items()):
                code = process.proc.poll()
                if code is None or name in self.killed:
                    continue
                lines = [
                    line
                    for line in process.log().splitlines()
                    if "CRITICAL" in line or "Unrecoverable" in line or "Error:" in line
                ]
                self.crashes.append((time.time(), name, code, (lines or ["?"])[-1][:300]))
                self.killed.add(name)
                self.restart(name)
                revived.append(name)
        return revived

    def stop(self, name: str) -> float:
        """SIGSTOP the whole group: the worker freezes mid-whatever, holding what it holds."""
        self.workers[name].signal(signal.SIGSTOP)
        with self.lock:
            self.stopped.add(name)
        return time.time()

    def cont(self, name: str) -> float:
        self.workers[name].signal(signal.SIGCONT)
        with self.lock:
            self.stopped.discard(name)
        return time.time()

    def owner_of(self, pid: int | None) -> str | None:
        """The worker whose process group ``pid`` (a prefork child or main) belongs to."""
        if pid is None:
            return None
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        with self.lock:
            for name, process in self.workers.items():
                if process.pid == group and process.proc.poll() is None:
                    return name
        return None

    def members(self, name: str) -> list[int]:
        """Pids of the worker's process group (main process and prefork children)."""
        group = self.workers[name].pid
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == group:
                        pids.append(int(entry))
                except ProcessLookupError:
                    continue
        return pids

    def healthy(self) -> bool:
        with self.lock:
            return all(
                process.proc.poll() is None and name not in self.stopped
                for name, process in self.workers.items()
            )

    def shutdown(self) -> None:
        """Beat first, then the workers (a stopped one is continued so it can exit)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            workers = list(self.workers.items())
        if self.beat is not None:
            self.beat.stop(timeout=5)
        for name, process in workers:
            if name in self.stopped:
                process.signal(signal.SIGCONT)
            process.stop(timeout=10)
