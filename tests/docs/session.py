"""One shell session per doc page: a fresh HOME and working directory, state kept between blocks.

Each command runs as its own ``bash`` process (so each has its own timeout), but the session
behaves as one terminal: the script starts with ``set -e -a``, loads the variables and the
working directory the previous command left, and saves them when it exits. ``set -a`` exports
every assignment, so ``TOKEN=$(…)`` in one block is ``$TOKEN`` in the next.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The PATH of a new login shell; the session puts its virtualenv's ``bin`` first.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables passed through from the runner: the user, and pip's configuration of the package
#: index on this machine.
PASSED = ("USER", "LOGNAME", "LANG", "TZ")


@dataclass
class Result:
    status: int
    output: str
    timed_out: bool = False


@dataclass
class Job:
    """A background command: its process group and its log."""

    command: str
    line: int
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@dataclass
class Session:
    """The state of one page's terminal, kept in ``folder``."""

    folder: Path
    venv_bin: Path
    cwd: Path
    jobs: list[Job] = field(default_factory=list)

    def __post_init__(self) -> None:
        home = self.folder / "home"
        home.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k in PASSED or k.startswith("PIP_")}
        env.update(
            HOME=str(home),
            PATH=f"{self.venv_bin}:{SYSTEM_PATH}",
            VIRTUAL_ENV=str(self.venv_bin.parent),
            TERM="dumb",
            COLUMNS="80",
            NO_COLOR="1",
            CI=os.environ.get("CI", ""),
        )
        self._env = env
        state = self.folder / "state"
        state.mkdir()
        self._vars = state / "vars"
        self._vars.write_text("", encoding="utf-8")
        self._pwd = state / "pwd"
        self._pwd.write_text(str(self.cwd), encoding="utf-8")

    def _script(self, body: str, *, keep_state: bool) -> str:
        save = (
            f"trap 'export -p > {self._vars}.new && mv {self._vars}.new {self._vars}; "
            f"pwd > {self._pwd}' EXIT\n"
            if keep_state
            else ""
        )
        return f'set -e -a\n. {self._vars}\ncd "$(cat {self._pwd})"\n{save}{body}\n'

    def run(self, body: str, *, timeout: float, python: bool = False) -> Result:
        """Run ``body`` (a shell script, or Python source) in the session; stdout, then stderr."""
        if python:
            body = f"python - <<'__DOC_TEST_PY__'\n{body}\n__DOC_TEST_PY__"
        script = self._script(body, keep_state=True)
        with subprocess.Popen(
            ["bash", "-c", script],
            env=self._env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, err = proc.communicate()
                return Result(-1, _text(out) + _text(err), timed_out=True)
        return Result(proc.returncode, _text(out) + _text(err))

    def start(self, command: str, line: int) -> Job:
        """Start ``command`` as a background job in its own process group."""
        log = self.folder / f"job-{len(self.jobs) + 1}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                ["bash", "-c", self._script(command, keep_state=False)],
                env=self._env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        job = Job(command, line, proc, log)
        self.jobs.append(job)
        return job

    def variable(self, name: str, value: str) -> None:
        """Set ``name`` for every later command of the session."""
        with self._vars.open("a", encoding="utf-8") as sink:
            sink.write(f"export {name}={value}\n")

    def stop(self) -> list[Job]:
        """Stop every job (SIGTERM, then SIGKILL); the jobs that had already exited."""
        exited = [job for job in self.jobs if job.proc.poll() is not None]
        for job in self.jobs:
            _kill_group(job.proc, first=signal.SIGTERM)
        self.jobs = []
        return exited


def _kill_group(proc: subprocess.Popen[bytes], first: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, first)
    if first != signal.SIGKILL:
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
