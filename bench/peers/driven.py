"""The peers run by a driver of their own (:mod:`bench.peers.driver`): DBOS Transact and
Prefect 3, each from its own virtualenv, each giving one or more rows of item 1.

A peer that cannot be had (its virtualenv cannot be made, its driver does not start, a chain
fails) keeps the error text as its rows' result; the other contestants go on.
"""

from __future__ import annotations

import abc
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import stats
from bench.peers import venv
from bench.peers.driver import DRIVERS, Driver
from bench.scratch import fresh_database

#: Seconds a driver has to start and warm up (Prefect's first flow starts its server).
START_TIMEOUT_S = 300.0
#: Seconds one timed chain may take.
CHAIN_TIMEOUT_S = 600.0


@dataclass
class Row:
    """One row of item 1's peers: one way of running a peer's chain, and its timings."""

    key: str
    peer: str
    label: str
    short: str
    mode: str
    links: int
    how: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    error: str | None = None

    def record(self, payload: dict[str, Any], ok_status: str) -> None:
        """Keep one timed chain; a chain that did not end in ``ok_status`` ends the row."""
        status = str(payload.get("status"))
        self.statuses.append(status)
        if status != ok_status:
            self.error = f"a chain of {self.links} ended {status}, not {ok_status}"
            return
        self.seconds.append(float(payload["seconds"]))

    def result(self, interleaved: bool) -> dict[str, Any]:
        """The report's entry: per-link seconds over the chains timed, or why there are none."""
        head = {"peer": self.peer, "label": self.label, "short": self.short}
        if self.error is not None:
            return {**head, "skipped": self.error}
        return {
            **head,
            "versions": self.versions,
            "how": self.how,
            "links": self.links,
            "interleaved_with_engine": interleaved,
            "statuses": self.statuses,
            "per_link_s": stats.spread([seconds / self.links for seconds in self.seconds]),
        }


class DrivenPeer(abc.ABC):
    """A peer in its virtualenv, its driver up from :meth:`start` to :meth:`close`."""

    #: The peer's name in the report, what ``pip`` installs, a module that shows it is there.
    name: str
    requirement: str
    module: str
    #: The driver run with the virtualenv's python, and the status of a chain that worked.
    script: Path
    ok_status: str
    #: Environment variables of the peer's own that this process's must not pass on.
    env_prefixes: tuple[str, ...] = ()

    def __init__(self, venv_path: Path, folder: Path, links: int) -> None:
        self.venv = venv_path
        self.folder = folder
        self.links = links
        self.rows = self.make_rows()
        self._driver: Driver | None = None
        self._stack = contextlib.ExitStack()

    @abc.abstractmethod
    def make_rows(self) -> list[Row]:
        """The rows this peer gives, one per way its chain runs."""

    @abc.abstractmethod
    def prepare(self, admin_url: str) -> tuple[list[str], dict[str, str]]:
        """The driver's arguments and extra environment (databases made here are dropped at
        :meth:`close`)."""

    @abc.abstractmethod
    def describe(self, ready: dict[str, Any]) -> str | None:
        """Fill the rows' ``how`` from the driver's ready payload; an error text when what
        started is not what the bench measures."""

    def start(self, admin_url: str) -> None:
        """Make the virtualenv, start the driver and wait for it to be warm."""
        failed = venv.ensure(self.venv, self.requirement, self.module)
        if failed is None:
            try:
                failed = self._start(admin_url)
            except Exception as exc:  # a peer that cannot be had is a row's text, not a crash
                failed = f"{self.name} did not start: {exc}"
        if failed is not None:
            self.fail(failed)

    def _start(self, admin_url: str) -> str | None:
        args, extra = self.prepare(admin_url)
        env = {**venv.environment(self.venv, drop_prefixes=self.env_prefixes), **extra}
        log = self.folder / f"{self.script.stem}.log"
        self._driver = Driver(venv.python(self.venv), self.script, args, env, log)
        self._stack.callback(self._driver.close)
        ready = self._driver.wait_ready(START_TIMEOUT_S)
        for row in self.rows:
            row.versions = dict(ready.get("versions") or {})
        return self.describe(ready)

    def fail(self, error: str) -> None:
        for row in self.rows:
            row.error = row.error or error

    def contestants(self) -> list[Callable[[], None]]:
        """One callable per row: time one chain of that row (nothing once it has failed)."""
        return [lambda row=row: self.time(row) for row in self.rows]

    def time(self, row: Row) -> None:
        if row.error is not None or self._driver is None:
            return
        try:
            row.record(self._driver.ask(row.mode, CHAIN_TIMEOUT_S), self.ok_status)
        except Exception as exc:  # the row says why it stopped; the other contestants go on
            row.error = f"{row.mode}: {exc}"

    def groups(self) -> list[int]:
        """The process group of the driver (and the servers it started), while it is up."""
        return [self._driver.process.pid] if self._driver is not None else []

    def close(self) -> None:
        self._stack.close()

    def database(self, admin_url: str, prefix: str) -> str:
        """A fresh PostgreSQL database beside ``admin_url`` (dropped at :meth:`close`), its
        URL without a driver name."""
        name = f"orch_bench_{prefix}_{uuid.uuid4().hex[:6]}"
        url, drop = fresh_database(admin_url, self.folder, name)
        if drop is not None:
            self._stack.callback(drop)
        return url.replace("postgresql+psycopg://", "postgresql://")


class DBOSPeer(DrivenPeer):
    """DBOS Transact: durable steps whose checkpoints go to a fresh database on the bench's
    PostgreSQL server; timed through a DBOS queue and called in-process."""

    name = "DBOS Transact"
    requirement = "dbos"
    module = "dbos"
    script = DRIVERS / "dbos_chain.py"
    ok_status = "SUCCESS"
    env_prefixes = ("DBOS_",)

    def make_rows(self) -> list[Row]:
        return [
            Row("dbos_queue", self.name, "through its queue", "DBOS queue", "queue", self.links),
            Row("dbos_in_process", self.name, "called in-process", "DBOS call", "call", self.links),
        ]

    def prepare(self, admin_url: str) -> tuple[list[str], dict[str, str]]:
        return [self.database(admin_url, "dbos"), str(self.links)], {}

    def describe(self, ready: dict[str, Any]) -> str | None:
        steps = f"a workflow of {self.links} `@DBOS.step` no-ops"
        database = "system database: a fresh one on the same PostgreSQL"
        queue_poll = ready.get("queue_polling_interval_s")
        await_poll = ready.get("await_polling_interval_s")
        self.rows[0].how = (
            f"{steps}, enqueued on a DBOS queue (polled every {queue_poll:g} s, DBOS's "
            f"default) and awaited with `get_result` (polled every {await_poll * 1000:g} ms); "
            f"{database}"
        )
        self.rows[1].how = f"{steps}, the workflow function called directly; {database}"
        return None


class PrefectPeer(DrivenPeer):
    """Prefect 3: tasks in a flow, called in-process, against Prefect's ephemeral API server
    (SQLite, Prefect's default on one machine, or a fresh PostgreSQL database)."""

    name = "Prefect"
    requirement = "prefect>=3,<4"
    module = "prefect"
    script = DRIVERS / "prefect_chain.py"
    ok_status = "COMPLETED"
    env_prefixes = ("PREFECT_",)

    def __init__(self, venv_path: Path, folder: Path, links: int, database: str) -> None:
        super().__init__(venv_path, folder, links)
        self.database_kind = database

    def make_rows(self) -> list[Row]:
        return [Row("prefect", self.name, "tasks in a flow", "Prefect", "flow", self.links)]

    def prepare(self, admin_url: str) -> tuple[list[str], dict[str, str]]:
        home = self.folder / "prefect-home"
        home.mkdir(exist_ok=True)
        env = {
            "PREFECT_HOME": str(home),
            # Nothing leaves the machine: no usage reports from the server or the client.
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
        }
        if self.database_kind == "postgresql":
            url = self.database(admin_url, "prefect")
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = url.replace(
                "postgresql://", "postgresql+asyncpg://", 1
            )
        return [str(self.links)], env

    def describe(self, ready: dict[str, Any]) -> str | None:
        version = (ready.get("versions") or {}).get("prefect", "?")
        if not version.startswith("3."):
            return f"prefect {version} in its virtualenv; the bench measures Prefect 3"
        database = {
            "sqlite": "SQLite under `PREFECT_HOME` (Prefect's default)",
            "postgresql": "a fresh PostgreSQL database on the same server",
        }.get(str(ready.get("database")), str(ready.get("database")))
        server = ready.get("server")
        where = (
            "Prefect's ephemeral API server (a subprocess on loopback, started by the first flow)"
            if server == "ephemeral"
            else f"the API at {server}"
        )
        self.rows[0].how = (
            f"a flow of {self.links} `@task` no-ops, called in-process; {where}; database: "
            f"{database}"
        )
        return None
