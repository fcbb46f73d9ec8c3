"""Starting and stopping worker and beat processes (the demo and the integration tests).

Each process gets its own session (process group), so stopping it also reaches its prefork
children; stop order is beat, workers, then the broker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path


class ManagedProcess:
    """A child process with a log file, stopped gracefully or killed with its group."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float) -> None:
        """Wait until ``needle`` appears in the log; raise with the log tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{self.argv[2:5]} not ready: ...{self.log()[-3000:]}")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the whole process group (the main process and its children)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL the group if it lingers."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.signal(signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        self._log.close()


def celery_argv(*args: str) -> list[str]:
    """The command line of ``celery -A tasks ARGS`` in a new process."""
    return [sys.executable, "-m", "celery", "-A", "tasks", *args]


def celery_here(*args: str) -> None:
    """``celery -A tasks ARGS`` in this process (``orchestration worker`` and ``beat``): the
    worker's app is found by name, so no surface imports ``tasks``."""
    from celery.bin.celery import celery

    celery.main(args=["-A", "tasks", *args], prog_name="celery", standalone_mode=False)


def start_worker(
    env: Mapping[str, str],
    log_path: Path,
    *,
    concurrency: int = 2,
    name: str = "worker",
    extra: tuple[str, ...] = (),
) -> ManagedProcess:
    """A prefork worker; mingle and gossip are off (they only slow start-up here)."""
    return ManagedProcess(
        celery_argv(
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--without-mingle",
            "--without-gossip",
            "-E",
            "-l",
            "INFO",
            *extra,
        ),
        env,
        log_path,
    )


def start_beat(env: Mapping[str, str], log_path: Path, schedule: Path) -> ManagedProcess:
    """Celery beat with its schedule file at ``schedule``."""
    return ManagedProcess(celery_argv("beat", "-l", "INFO", "-s", str(schedule)), env, log_path)
