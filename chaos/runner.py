"""One chaos run, start to end: services, fleet, population and faults, drain, audit, teardown.

Phases:

1. *setup*: the broker (a private Redis, a private RabbitMQ vhost, or a shared broker), a fresh
   PostgreSQL database (migrated and instrumented), two prefork workers and a beat;
2. *launch*: the driver launches the seeded population over the window while the injector
   applies the fault plan, one fault at a time, healing the fleet after each;
3. *drain*: faults stop, the fleet is whole, and every run is given time to end (every step has
   a timeout, so every run has an end); bounded by the duration limit;
4. *audit*: the fleet is stopped and the figures are read from the database;
5. *teardown*: the database is dropped, the private broker stopped.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from chaos.audit import MUST_BE_ZERO, TOLERANCE, Audit, instrument
from chaos.driver import Driver, retrying
from chaos.faults import KINDS, RECONNECT, Injector, fault_plan
from chaos.fleet import WORKERS, Fleet, app_name
from chaos.hostile import HostileAgents, Storm, plan_hostile
from chaos.memory import MemoryWatch
from chaos.netns import Network, probe
from chaos.partitions import PARTITION_KINDS, Partitions
from chaos.population import plan_population
from chaos.profiles import CHAOS_SETTINGS, Profile
from chaos.report import failures
from chaos.services import ChaosDatabase, PrivateRedis, RabbitVhost
from chaos.tenants import schedule_fires, secrets_stored, tenant_figures
from orchestration.core.settings import Settings

_LIVE = ["queued", "running", "waiting", "parked", "cancelling"]


@dataclass(frozen=True)
class Options:
    """What the command line asked for."""

    profile: Profile
    seed: int
    broker: str
    database: str
    keep_logs: bool = False
    kinds: tuple[str, ...] = KINDS
    #: Launch the profile's hostile owners beside the plain population.
    hostile: bool = True


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _redact(url: str) -> str:
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"


def _broker(spec: str, folder: Path) -> tuple[Any, str, dict[str, str]]:
    """(restartable broker or None, broker URL, description) for ``--broker``."""
    if spec == "own-redis":
        if shutil.which("redis-server") is None:
            raise RuntimeError("--broker own-redis needs redis-server on PATH")
        redis = PrivateRedis(folder)
        redis.start()
        return redis, redis.url, {"kind": "redis", "mode": "private", "url": redis.url}
    scheme = spec.split("://", 1)[0]
    if scheme in ("amqp", "pyamqp"):
        host = make_url(spec.replace(scheme, "postgresql", 1)).host or ""
        if RabbitVhost.available() and host in ("127.0.0.1", "localhost", "::1"):
            vhost = RabbitVhost(spec)
            vhost.start()
            return (
                vhost,
                vhost.url,
                {"kind": "rabbitmq", "mode": "vhost", "url": _redact(vhost.url)},
            )
        return None, spec, {"kind": "rabbitmq", "mode": "shared", "url": _redact(spec)}
    if scheme in ("redis", "rediss"):
        return None, spec, {"kind": "redis", "mode": "shared", "url": _redact(spec)}
    raise ValueError(f"--broker {spec!r}: expected own-redis, redis://... or amqp://...")


def _live(observer: Engine) -> int:
    """Live runs of any kind: launched, scheduled, branch."""
    with observer.connect() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM runs WHERE status = ANY(:live)"), {"live": _LIVE}
            ).scalar()
            or 0
        )


def _network(
    kinds: tuple[str, ...], urls: list[str], folder: Path
) -> tuple[Network | None, dict[str, Any]]:
    """The namespace of the partition faults, or ``None`` and why (they are then skipped)."""
    if not set(kinds) & set(PARTITION_KINDS):
        return None, {"available": False, "reason": "no partition fault asked for"}
    parts = [urlsplit(url) for url in urls]
    remote = [part.hostname for part in parts if part.hostname not in ("127.0.0.1", "localhost")]
    reason = f"{remote[0]} is not a loopback service" if remote else probe()
    if reason is not None:
        log(f"partition faults SKIPPED: {reason}")
        return None, {"available": False, "reason": reason}
    ports = [part.port or {"amqp": 5672, "pyamqp": 5672}.get(part.scheme, 6379) for part in parts]
    network = Network(sorted(set(ports)), folder)
    network.start()
    log(f"partition faults: namespace {network.name}, {network.ns_ip} <-> {network.host_ip}")
    info = {"available": True, "namespace": network.name, "host": network.host_ip}
    return network, {**info, "namespaced": network.ns_ip, "ports": network.ports}


def run(options: Options) -> dict[str, Any]:
    """Run the chaos suite; return the report (see :mod:`chaos.report`)."""
    profile = options.profile
    wall_start = time.time()
    started_iso = datetime.now(UTC).isoformat(timespec="seconds")
    hard_stop = wall_start + profile.duration_limit - 20.0
    folder = Path(tempfile.mkdtemp(prefix="chaos-"))
    plan_rng = random.Random(options.seed)
    plans = plan_population(plan_rng, profile.runs, profile.window)
    kinds = fault_plan(plan_rng, profile.faults, options.kinds)
    sizes = profile.hostile
    phases: dict[str, float] = {}
    broker: Any = None
    database: ChaosDatabase | None = None
    fleet: Fleet | None = None
    network: Network | None = None
    driver: Driver | None = None
    agents: HostileAgents | None = None
    memory: MemoryWatch | None = None
    storm: Storm | None = None
    engines: list[Engine] = []
    report: dict[str, Any] = {}
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        broker, broker_url, broker_info = _broker(options.broker, folder)
        database = ChaosDatabase(options.database)
        database.create()
        instrument(database.url("chaos-setup"))
        queue = f"chaos-{uuid.uuid4().hex[:8]}"
        if isinstance(broker, RabbitVhost):
            broker.queue = queue
        env = {
            **os.environ,
            **CHAOS_SETTINGS,
            **sizes.settings(),
            "ORCH_BROKER_URL": broker_url,
            "ORCH_QUEUE": queue,
            "ORCH_DATABASE_URL": database.url("chaos-driver"),
        }
        if options.hostile:
            oversize = int(env["ORCH_MAX_OUTPUT_BYTES"]) + 65536
            agents = HostileAgents(oversize)
            agents.start()
            env.update(agents.env())
        settings = Settings.model_validate(
            {key[5:].lower(): value for key, value in env.items() if key.startswith("ORCH_")}
        )
        observer = create_engine(
            database.url("chaos-observer"), isolation_level="AUTOCOMMIT", pool_pre_ping=True
        )
        lock_engine = create_engine(database.url("chaos-trap"), pool_pre_ping=True)
        engines += [observer, lock_engine]
        fleet = Fleet(env, folder, queue, {w: database.url(app_name(w)) for w in WORKERS})
        fleet.start()
        memory = MemoryWatch(fleet)
        memory.start()
        driver = Driver(settings, random.Random(options.seed + 1))
        if agents is not None:
            hostile_rng = random.Random(options.seed + 3)
            plans = sorted(
                plans + plan_hostile(hostile_rng, sizes, settings, profile.window),
                key=lambda plan: plan.at,
            )
            storm = Storm(driver.orch, sizes.storm_schedules)
            agents.register(settings)
        pg_url = make_url(database.url("chaos-driver")).set(drivername="postgresql")
        network, network_info = _network(
            options.kinds,
            [broker_url, pg_url.render_as_string(hide_password=False)],
            folder,
        )
        injector = Injector(
            fleet,
            database,
            broker,
            driver,
            plans,
            random.Random(options.seed + 2),
            heartbeat_timeout=settings.heartbeat_timeout,
            lock_engine=lock_engine,
            observer=observer,
        )
        injector.partitions = Partitions(
            network,
            str(network_info.get("reason", "")),
            fleet,
            env,
            database.url,
            observer,
            injector.live_runs,
            heartbeat_timeout=settings.heartbeat_timeout,
            broker_port=urlsplit(broker_url).port or 5672,
            reconnect=RECONNECT,
        )
        phases["setup_s"] = time.time() - wall_start
        log(
            f"setup done in {phases['setup_s']:.1f}s: {len(plans)} runs over "
            f"{profile.window:.0f}s, {len(kinds)} faults, broker {broker_info['kind']} "
            f"({broker_info['mode']}), database {database.name}, logs {folder}"
        )

        # -- launch and faults ------------------------------------------------------------
        if storm is not None:
            storm.register()
            log(f"schedule storm: {storm.describe()}")
        launch_start = time.time()
        launcher = threading.Thread(
            target=driver.run, args=(plans, launch_start, stop), name="chaos-launch", daemon=True
        )
        faulter = threading.Thread(
            target=injector.run,
            args=(kinds, min(launch_start + profile.fault_window, hard_stop - 60), stop),
            name="chaos-faults",
            daemon=True,
        )
        threads += [launcher, faulter]
        launcher.start()
        time.sleep(6.0)  # runs in flight before the first fault
        faulter.start()
        while launcher.is_alive() or faulter.is_alive():
            launcher.join(1)
            faulter.join(0.1)
            fleet.supervise()  # a worker that dies by itself is restarted, and counted
            if time.time() > hard_stop - 30:
                stop.set()
        phases["launch_s"] = time.time() - launch_start
        if storm is not None:
            retrying(storm.pause)
        injected = sum(1 for fault in injector.faults if fault.injected)
        log(f"launch phase done: {injected}/{len(injector.faults)} faults injected")

        # -- drain ------------------------------------------------------------------------
        drain_start = time.time()
        for name in WORKERS:
            if name in fleet.stopped:
                fleet.cont(name)
        fleet.supervise()
        for name in WORKERS:
            if fleet.workers[name].proc.poll() is not None:
                fleet.restart(name)
        try:
            driver.wait(max(1.0, hard_stop - time.time()))
        except Exception as exc:  # follow-ups that did not finish are part of the report
            log(f"follow-ups did not all finish: {type(exc).__name__}")
        live = -1
        while time.time() < hard_stop:
            live = _live(observer)
            if live == 0:
                break
            fleet.supervise()
            time.sleep(1.0)
        ended_at = time.time()
        phases["drain_s"] = ended_at - drain_start
        log(f"drain done in {phases['drain_s']:.1f}s ({max(live, 0)} runs still live)")
        time.sleep(2.0)  # late writes (a zombie, a redelivery) land before the audit reads
        memory.stop()
        fleet.shutdown()

        # -- audit ------------------------------------------------------------------------
        audit_start = time.time()
        excused = [f.outage for f in injector.faults if f.outage] + injector.holds
        audit = Audit(observer, driver.records, plans, injector.faults, excused, ended_at)
        figures = audit.figures()
        figures["worker_crashes"] = len(fleet.crashes)
        tenants = tenant_figures(audit, plans)
        figures["runs_lost"] += tenants["scheduled_runs_live"]
        figures.update(tenants)
        figures.update(memory.figures())
        figures["secrets_seen_by_hostile_servers"] = 0
        figures["secrets_stored"] = 0
        if agents is not None:
            figures.update(agents.figures())
            figures["secrets_stored"] = secrets_stored(observer, agents.secret, folder)
        phases["audit_s"] = time.time() - audit_start
        report = {
            "seed": options.seed,
            "profile": profile.name,
            "runs_requested": profile.runs,
            "window_s": profile.window,
            "broker": broker_info,
            "database": database.name,
            "started": started_iso,
            "wall_seconds": round(time.time() - wall_start, 1),
            "phases": {k: round(v, 1) for k, v in phases.items()},
            "settings": CHAOS_SETTINGS,
            "tolerance_s": TOLERANCE,
            "must_be_zero": list(MUST_BE_ZERO),
            "figures": figures,
            "outcomes": audit.outcomes(),
            "faults": audit.convergence(),
            "partitions": network_info,
            "hostile": {
                "on": agents is not None,
                "sizes": asdict(sizes),
                "servers": agents.describe() if agents is not None else [],
                "storm": storm.describe() if storm is not None else None,
                "schedules": schedule_fires(observer),
                "refused": dict(driver.records.refused),
            },
            "excused_windows": [[round(a, 3), round(b, 3)] for a, b in excused],
            "fault_log": [fault.as_dict() for fault in injector.faults],
            "worker_crashes": [
                {"at": at, "worker": name, "exit": code, "log": line}
                for at, name, code, line in fleet.crashes
            ],
            "violations": audit.violations[:50],
            "stale_writes": audit.stale_writes()["stale_examples"],
            "logs": str(folder),
            "reproduce": (
                f"python -m chaos --profile {profile.name} --runs {profile.runs} "
                f"--seed {options.seed} --broker {options.broker} "
                f"--database {_redact(options.database)}"
                + (f" --faults {','.join(options.kinds)}" if options.kinds != KINDS else "")
                + (" --no-baseline" if options.hostile else " --plain")
                + " --hostile-sizes "
                + ",".join(f"{k}={v}" for k, v in asdict(sizes).items())
            ),
        }
        report["failures"] = failures(report)
        return report
    finally:
        # Stop the threads first: a fault must not restart a worker after the shutdown.
        stop.set()
        if driver is not None:
            driver.stop.set()
        for thread in threads:
            thread.join(timeout=30)
        if memory is not None:
            memory.stop()
        if fleet is not None:
            fleet.shutdown()
        if agents is not None:
            agents.stop()
        if network is not None:
            network.close()
        if driver is not None:
            driver.close()
        for engine in engines:
            engine.dispose()
        if database is not None:
            try:
                database.drop()
            except Exception as exc:
                log(f"could not drop {database.name}: {exc}")
        if broker is not None:
            broker.stop()
        if not options.keep_logs and report and not report.get("failures"):
            shutil.rmtree(folder, ignore_errors=True)
