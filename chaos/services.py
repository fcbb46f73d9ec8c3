"""The services a chaos run owns: a broker it may restart, and a database it creates and drops.

Nothing here touches a service another engineer uses:

* Redis: the run starts its *own* ``redis-server`` on a free loopback port, so killing and
  restarting it (losing every queued and unacknowledged message) disturbs nobody. A shared Redis
  URL can be given instead; the broker-restart fault is then skipped and reported as such.
* RabbitMQ: the run creates its own virtual host on the given node (``rabbitmqctl``), and the
  broker-restart fault closes that vhost's connections and purges its queue. A real RabbitMQ
  restart keeps durable queues; the purge adds the message loss a Redis restart has.
* PostgreSQL: one fresh database per run, dropped at the end. Restarting the shared server is
  not possible here, so "PostgreSQL restarts" is simulated by terminating every connection of
  the chaos database (``pg_terminate_backend``), which is what clients see of a restart.

The database is instrumented with a trigger that journals every change of a run's status,
``deadline_at`` or ``heartbeat_at`` with the wall clock and the writer's ``application_name``
(each worker connects under its own name). The audit reads the deadline promise from it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from orchestration.core.db import dispose_engines, normalize_url, upgrade


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A ``redis-server`` of this chaos run, on a free port, without persistence."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        """Start the server and wait until it answers PING."""
        self.starts += 1
        log = self.folder / "redis.log"
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
                "--logfile",
                str(log),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    client.close()
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start; see {log}")

    def kill(self) -> None:
        """SIGKILL: every queued and unacknowledged message is lost (no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()


class RabbitVhost:
    """A virtual host of this chaos run on a local RabbitMQ node."""

    def __init__(self, base_url: str) -> None:
        self.base = urlsplit(base_url)
        self.name = f"chaos-{uuid.uuid4().hex[:8]}"
        self.queue = ""

    @staticmethod
    def available() -> bool:
        return shutil.which("rabbitmqctl") is not None

    @property
    def url(self) -> str:
        user = self.base.username or "guest"
        password = self.base.password or "guest"
        host = self.base.hostname or "127.0.0.1"
        port = self.base.port or 5672
        return f"{self.base.scheme}://{user}:{password}@{host}:{port}/{self.name}"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            ["rabbitmqctl", "-q", *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

    def start(self) -> None:
        user = self.base.username or "guest"
        self._ctl("add_vhost", self.name)
        self._ctl("set_permissions", "-p", self.name, user, ".*", ".*", ".*")

    def restart(self) -> None:
        """Drop every connection of the vhost and purge the run's queue (messages lost)."""
        self._ctl("close_all_connections", "--vhost", self.name, "chaos: broker restart")
        if self.queue:
            with contextlib.suppress(subprocess.CalledProcessError):
                self._ctl("purge_queue", "-p", self.name, self.queue)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self._ctl("delete_vhost", self.name)


_INSTRUMENT = """
CREATE TABLE chaos_run_writes (
    id bigserial PRIMARY KEY,
    run_id varchar(32) NOT NULL,
    status varchar(20) NOT NULL,
    deadline_at timestamptz,
    heartbeat_at timestamptz,
    updated_at timestamptz,
    rearms integer,
    at timestamptz NOT NULL,
    app text NOT NULL
);
CREATE INDEX ix_chaos_run_writes ON chaos_run_writes (run_id, id);
CREATE FUNCTION chaos_note_run() RETURNS trigger AS $$
BEGIN
    INSERT INTO chaos_run_writes
        (run_id, status, deadline_at, heartbeat_at, updated_at, rearms, at, app)
    VALUES (NEW.id, NEW.status, NEW.deadline_at, NEW.heartbeat_at, NEW.updated_at, NEW.rearms,
            clock_timestamp(), current_setting('application_name'));
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER chaos_run_insert AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION chaos_note_run();
CREATE TRIGGER chaos_run_update AFTER UPDATE ON runs
    FOR EACH ROW WHEN (
        OLD.status IS DISTINCT FROM NEW.status
        OR OLD.deadline_at IS DISTINCT FROM NEW.deadline_at
        OR OLD.heartbeat_at IS DISTINCT FROM NEW.heartbeat_at
    ) EXECUTE FUNCTION chaos_note_run();
"""


class ChaosDatabase:
    """A fresh PostgreSQL database for one chaos run, migrated and instrumented."""

    def __init__(self, admin_url: str) -> None:
        admin = make_url(normalize_url(admin_url))
        if not admin.drivername.startswith("postgresql"):
            raise ValueError("the chaos suite needs PostgreSQL (--database postgresql://...)")
        self.admin_url = admin.render_as_string(hide_password=False)
        self.name = f"chaos_{uuid.uuid4().hex[:10]}"
        self._admin: Engine | None = None
        self.row_locks = False

    def url(self, app: str) -> str:
        """The database URL for one process; ``app`` names its connections in the server."""
        base = make_url(self.admin_url).set(database=self.name)
        return base.update_query_dict({"application_name": app}).render_as_string(
            hide_password=False
        )

    def admin(self) -> Engine:
        if self._admin is None:
            self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        return self._admin

    def create(self) -> None:
        with self.admin().connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{self.name}"'))
        upgrade(self.url("chaos-migrate"))
        engine = create_engine(self.url("chaos-setup"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(_INSTRUMENT)
                try:
                    connection.execute(text("CREATE EXTENSION IF NOT EXISTS pgrowlocks"))
                    self.row_locks = True
                except Exception:  # the contrib package is optional: fall back to pids
                    self.row_locks = False
        finally:
            engine.dispose()

    def terminate_connections(self) -> int:
        """Drop every connection to the chaos database (what a PostgreSQL restart looks like)."""
        with self.admin().connect() as connection:
            killed = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": self.name},
            ).scalar()
        return int(killed or 0)

    def drop(self) -> None:
        dispose_engines()
        with self.admin().connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin().dispose()
