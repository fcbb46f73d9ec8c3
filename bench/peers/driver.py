"""A peer's driver process, seen from the benchmark: started once with the peer's python, kept
up for the rounds of item 1, asked for one timed chain at a time (``drivers/peer_protocol``).

Its standard error goes to a log file beside the bench's other logs; its standard output is
read by a thread, so that a driver that hangs or dies ends a wait with an error rather than
blocking the benchmark.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from bench.peers.drivers.peer_protocol import FAILED, READY, TIMED, parse

DRIVERS = Path(__file__).resolve().parent / "drivers"


class DriverError(RuntimeError):
    """The driver failed, died or did not answer in time; the text says which."""


class Driver:
    """One driver process (``script`` run by ``python``) and its protocol lines."""

    def __init__(
        self, python: Path, script: Path, args: list[str], env: dict[str, str], log: Path
    ) -> None:
        self.log = log
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._log_file = log.open("ab")
        self.process = subprocess.Popen(
            [str(python), str(script), *args],
            env=env,
            cwd=log.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """The driver's ``ready`` payload (versions and settings in effect)."""
        return self._answer(READY, timeout)

    def ask(self, mode: str, timeout: float) -> dict[str, Any]:
        """Time one chain in ``mode``: the driver's ``timed`` payload (seconds, status)."""
        stdin = self.process.stdin
        if stdin is None or self.process.poll() is not None:
            raise DriverError(f"the driver has exited: {self._log_tail()}")
        try:
            stdin.write(mode + "\n")
            stdin.flush()
        except OSError as exc:
            raise DriverError(f"the driver does not read its input: {self._log_tail()}") from exc
        return self._answer(TIMED, timeout)

    def _answer(self, kind: str, timeout: float) -> dict[str, Any]:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise DriverError(f"no answer in {timeout:g} s: {self._log_tail()}") from None
            if line is None:
                code = self.process.wait()
                raise DriverError(f"the driver exited ({code}): {self._log_tail()}")
            said = parse(line)
            if said is None:
                continue
            got, payload = said
            if got == FAILED:
                raise DriverError(f"{payload.get('mode')}: {payload.get('error')}")
            if got == kind:
                return payload

    def _log_tail(self) -> str:
        """The end of the driver's standard error, for the report (the folder is removed)."""
        self._log_file.flush()
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return "\n".join(lines[-15:])[-2000:] or "(no output)"

    def close(self, timeout: float = 30.0) -> None:
        """End the driver's input (it shuts its peer down and exits), then whatever is left
        of its process group (a server it started)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        finally:
            self._signal(signal.SIGTERM)
            self._reader.join(10)
            if self.process.stdout is not None and not self._reader.is_alive():
                self.process.stdout.close()
            self._log_file.close()

    def _signal(self, signum: int) -> None:
        signal_group(self.process.pid, signum)


def signal_group(leader: int, signum: int) -> None:
    """Send ``signum`` to the process group whose leader is ``leader`` (a process started
    with ``start_new_session``: it and every process it started), if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
