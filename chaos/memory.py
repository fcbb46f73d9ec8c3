"""The workers' memory during a chaos run: every process of each worker's group (the main
process and its prefork children) sampled for its resident set size, against a stated bound.

A hostile service can try to make a worker hold a large answer (an output over
``ORCH_MAX_OUTPUT_BYTES``, a body that never ends); the engine reads at most
``MAX_RESPONSE_BYTES`` of any answer, so a worker's memory stays bounded whatever a service
sends. The audit's ``worker_memory_over_bound`` counts the processes ever seen above the bound.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from chaos.fleet import WORKERS, Fleet

#: Resident set size no worker process may pass (MiB): an idle prefork process of this engine
#: holds about 100-150 MiB; the bound leaves room for a 16 MiB answer parsed twice over.
WORKER_RSS_BOUND_MB = 512.0
#: Seconds between two samples.
SAMPLE_EVERY = 1.0


def rss_mb(pid: int) -> float | None:
    """The resident set size of ``pid`` in MiB (``None`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


@dataclass
class MemoryWatch:
    """Samples the fleet's worker processes in a thread until :meth:`stop`."""

    fleet: Fleet
    bound_mb: float = WORKER_RSS_BOUND_MB
    samples: int = 0
    #: Largest RSS seen per worker (MiB), over all its processes and restarts.
    peak: dict[str, float] = field(default_factory=dict)
    #: Pids seen above the bound, with their largest RSS.
    over: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        """One sample of every worker process."""
        for name in WORKERS:
            if name not in self.fleet.workers:
                continue
            for pid in self.fleet.members(name):
                size = rss_mb(pid)
                if size is None:
                    continue
                self.peak[name] = max(self.peak.get(name, 0.0), size)
                if size > self.bound_mb:
                    self.over[pid] = max(self.over.get(pid, 0.0), size)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            try:
                self.sample()
            except (OSError, KeyError):
                continue  # a worker restarting between two reads

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="chaos-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def figures(self) -> dict[str, Any]:
        return {
            "worker_memory_over_bound": len(self.over),
            "worker_rss_peak_mb": {name: round(mb, 1) for name, mb in sorted(self.peak.items())},
            "worker_rss_bound_mb": self.bound_mb,
            "worker_rss_samples": self.samples,
        }
