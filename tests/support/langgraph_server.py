"""A real ``langgraph dev`` server for the provider tests: start, SIGKILL, restart.

The server runs from a temporary copy of ``tests/langgraph_app`` (its ``.langgraph_api``
folder is where the in-memory runtime saves, every ~10 s), on a fixed free loopback port so a
restart answers at the same URL the turns were started against.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

APP_DIR = Path(__file__).resolve().parent.parent / "langgraph_app"


def available() -> bool:
    """Whether the in-memory server (``langgraph-cli[inmem]``) is installed."""
    return all(importlib.util.find_spec(name) for name in ("langgraph", "langgraph_api"))


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LangGraphServer:
    """One ``langgraph dev`` process at a time, in ``workdir``."""

    def __init__(self, workdir: Path, *, jobs: int = 4, ready_within: float = 60.0) -> None:
        self.workdir = workdir / "app"
        shutil.copytree(APP_DIR, self.workdir, ignore=shutil.ignore_patterns("__pycache__"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "server.log"
        self._jobs = jobs
        self._ready_within = ready_within
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until ``/ok`` answers (or fail with its log)."""
        env = {
            **os.environ,
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGGRAPH_NO_VERSION_CHECK": "1",
            "LANGSMITH_TRACING": "false",
        }
        command = [
            sys.executable,
            "-m",
            "langgraph_cli",
            "dev",
            "--no-reload",
            "--no-browser",
            "--n-jobs-per-worker",
            str(self._jobs),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_within
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"langgraph dev exited early:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/ok", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"langgraph dev not ready within {self._ready_within}s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is saved on the way down."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """A clean stop (SIGTERM), falling back to SIGKILL."""
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signum)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

    def restart(self) -> None:
        """Start again in the same folder, on the same port (after a kill)."""
        self.kill()
        self.start()

    def tail(self, lines: int = 40) -> str:
        """The end of the server's log, for failure messages."""
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
