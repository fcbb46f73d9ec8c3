"""Upkeep (issue 13's closing note): what ``prune`` does to a database of N old terminal runs,
what it costs a concurrent sweep pass and ``/metrics``, and what a 20 MB artifact costs a read.

    python -m bench.upkeep --database-url postgresql://postgres@127.0.0.1:5432/test \
        [--runs 100000] [--json OUT]

Everything happens in a database the script creates beside ``--database-url`` and drops (a
SQLite file in a temporary folder for a ``sqlite://`` URL): rows are bulk-inserted the way
``bench.sweep_cost`` does, so 100k runs seed in a minute, not in hours of launches.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import multiprocessing
import os
import queue
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from sqlalchemy import insert, update
from sqlalchemy.engine import make_url

from bench import fmt, stats
from bench.scratch import scratch_database
from bench.upkeep_rows import OWNERS, check, footprint, run_rows, seed, vacuum
from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.runs import artifacts
from orchestration.runtime.executor import Executor
from orchestration.service import Orchestrator
from orchestration.surfaces.api import metrics, tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import retention
from orchestration.upkeep.sweeper import Sweeper

#: Outputs over this become artifacts in the read runs (the seeded ones are 4 KB).
INLINE_BYTES = 2048


class Probe:
    """One sweep pass and one ``/metrics`` render, timed; the pass judges every live run at
    the seed's ``now`` + 1 s, where all are healthy, so each pass is the same scan."""

    def __init__(self, settings: Settings, now: datetime, live: int) -> None:
        self.sweeper = Sweeper(settings, Executor(settings, None))
        self.registry = metrics.registry(settings, lambda: now + timedelta(seconds=1))
        self.now, self.live = now, live
        self.busy = 0
        generate_latest(self.registry)  # the first scrape reads the settled totals once

    def once(self) -> tuple[float, float]:
        started = time.perf_counter()
        report = self.sweeper.sweep(self.now + timedelta(seconds=1))
        swept = time.perf_counter() - started
        if report["live"] != self.live or report["errors"]:
            raise SystemExit(f"the sweep pass went wrong: {report}")
        self.busy += report["busy"]
        started = time.perf_counter()
        generate_latest(self.registry)
        return swept, time.perf_counter() - started


def summary(samples: list[tuple[float, float]]) -> dict[str, Any]:
    """Median and p95 of the sweep passes and the scrapes."""
    sweeps, scrapes = [s for s, _ in samples], [m for _, m in samples]
    return {
        "n": len(samples),
        "sweep_median": stats.median(sweeps),
        "sweep_p95": stats.percentile(sweeps, 95),
        "metrics_median": stats.median(scrapes),
        "metrics_p95": stats.percentile(scrapes, 95),
    }


def _prune_child(url: str, cutoff: str, begun: Any, results: Any) -> None:
    """The prune, in a process of its own as the CLI or the beat task runs it."""
    settings = Settings(database_url=url)
    transact = Executor(settings, None)
    begun.set()
    cpu = time.process_time()
    report = retention.prune(transact, cutoff=datetime.fromisoformat(cutoff))
    results.put({**report, "process_cpu_seconds": round(time.process_time() - cpu, 2)})


def _spin_child(seconds: float, begun: Any, results: Any) -> None:
    """The control: a neighbour that only keeps one core busy for ``seconds``, so a slowdown
    it causes as well is the 2-core machine's sharing, not the prune's locks or I/O."""
    begun.set()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    results.put({"seconds": seconds})


def under_load(target: Callable[..., None], args: tuple[Any, ...], probe: Probe) -> Any:
    """Start ``target`` in another process and probe in a loop until it ends; its result and
    the samples."""
    context = multiprocessing.get_context("spawn")
    begun, results = context.Event(), context.Queue()
    child = context.Process(target=target, args=(*args, begun, results))
    child.start()
    if not begun.wait(120):
        raise SystemExit(f"{target.__name__} did not start")
    samples = [probe.once()]
    while results.empty() and child.is_alive():
        samples.append(probe.once())
    try:
        # A child that died before its report (a crash, an import error) must not leave this
        # waiting the full ten minutes.
        report = results.get(timeout=600 if child.is_alive() else 10)
    except queue.Empty:
        child.join(10)
        raise SystemExit(f"{target.__name__} exited {child.exitcode} without a report") from None
    child.join(60)
    if child.exitcode != 0:
        raise SystemExit(f"{target.__name__} exited {child.exitcode}")
    return report, samples


def _median_time(work: Callable[[], Any], times: int) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        work()
        spent.append(time.perf_counter() - started)
    return stats.median(spent)


def reads(url: str, size: int, now: datetime, repeat: int, downloads: int) -> dict[str, Any]:
    """Read time of a run whose last step answered ``size`` bytes (kept as an artifact),
    of one that answered a small inline output, and of one that kept ``size`` bytes inline
    (``ORCH_INLINE_OUTPUT_BYTES`` raised: every output in its row, as before artifacts);
    then the streamed download of the artifact through ``GET .../output``."""
    settings, roomy = (
        Settings(
            database_url=url,
            inline_output_bytes=inline,
            max_output_bytes=2 * size,
            max_run_output_bytes=4 * size,
        )
        for inline in (INLINE_BYTES, 2 * size)
    )
    big = base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]
    cases = {
        "artifact": (settings, big),
        "inline": (settings, "x" * 1000),
        "inline_big": (roomy, big),
    }
    owner = OWNERS[1]
    ids: dict[str, str] = {}
    with session_scope(url) as session:
        for name, (kind, value) in cases.items():
            run, steps, _ = run_rows(1, "completed", now, now, {})
            session.execute(insert(Run), [run])
            session.execute(insert(Step), steps)
            kept = artifacts.keep(
                session,
                kind,
                owner=owner,
                run_pk=run["id"],
                step_index=2,
                value=value,
                now=now,
            )
            if not isinstance(kept, artifacts.Kept):
                raise SystemExit(f"{name}: {kept}")
            if (kept.sha256 is not None) != (name == "artifact"):
                raise SystemExit(f"{name} was kept {'as an artifact' if kept.sha256 else 'inline'}")
            session.execute(
                update(Step)
                .where(Step.run_id == run["id"], Step.index == 2)
                .values(output=kept.value, output_sha256=kept.sha256)
            )
            ids[name] = run["id"]
        token = tokens.create(session, owner, "bench", now=utcnow())
    orch = Orchestrator(settings, None)
    figures: dict[str, Any] = {"artifact_bytes": size}
    for name, run_id in ids.items():
        orch.get(run_id, owner=owner)
        figures[f"get_{name}"] = _median_time(partial(orch.get, run_id, owner=owner), repeat)
    client = TestClient(create_app(orch))
    headers = {"Authorization": f"Bearer {token}"}
    expected = hashlib.sha256(big.encode()).hexdigest()

    def download() -> None:
        digest = hashlib.sha256()
        with client.stream(
            "GET", f"/runs/{ids['artifact']}/steps/review/output", headers=headers
        ) as r:
            if r.status_code != 200:
                raise SystemExit(f"download: {r.status_code} {r.read()[:200]!r}")
            for piece in r.iter_bytes():
                digest.update(piece)
        if digest.hexdigest() != expected:
            raise SystemExit("download: the bytes do not hash to the artifact's sha256")

    figures["get_api_artifact"] = _median_time(
        lambda: client.get(f"/runs/{ids['artifact']}", headers=headers).raise_for_status(), repeat
    )
    figures["download"] = _median_time(download, downloads)
    figures["download_mb_s"] = size / 1e6 / figures["download"]
    return figures


def measure(options: argparse.Namespace) -> dict[str, Any]:
    """Seed, measure, prune under load, check, measure reads; the figures as a dict."""
    with scratch_database(options.database_url, "upkeep") as scratch:
        settings = Settings(database_url=scratch)
        url = settings.database_url
        now = utcnow()
        started = time.perf_counter()
        seeded = seed(url, options.runs, options.recent, options.live, now)
        seconds = {"seed": time.perf_counter() - started}
        vacuum(url)
        sizes = {"before": footprint(url)}
        probe = Probe(settings, now, options.live)
        idle = [probe.once() for _ in range(options.samples)]
        cutoff = now - timedelta(days=30)
        report, loaded = under_load(_prune_child, (url, cutoff.isoformat()), probe)
        sizes["after_prune"] = footprint(url)
        checked = check(url, cutoff, seeded)
        after = [probe.once() for _ in range(options.samples)]
        _, hogged = under_load(_spin_child, (report["seconds"],), probe)
        vacuum(url)
        sizes["after_vacuum"] = footprint(url)
        vacuum(url, full=True)
        sizes["after_vacuum_full"] = footprint(url)
        load: dict[str, Any] = {
            "idle": summary(idle),
            "during_prune": summary(loaded),
            "after_prune": summary(after),
            "during_cpu_hog": summary(hogged),
            "busy_passes": probe.busy,
        }
        for phase in ("during_prune", "during_cpu_hog"):
            load[f"{phase}_ratio"] = {
                key: stats.ratio(load[phase][key], load["idle"][key])
                for key in ("sweep_median", "sweep_p95", "metrics_median", "metrics_p95")
            }
        size = int(options.artifact_mb * 1e6)
        read = reads(url, size, now, options.repeat, options.downloads)
        return {
            "database": make_url(url).get_backend_name(),
            "runs": options.runs,
            "recent": options.recent,
            "live": options.live,
            "seeded_artifacts": seeded.artifacts,
            "seconds": seconds,
            "prune": report,
            "checks": checked,
            "sizes": sizes,
            "load": load,
            "reads": read,
        }


def render(result: dict[str, Any]) -> str:
    """The figures as three Markdown tables."""
    sizes = result["sizes"]
    stages = ("before", "after_prune", "after_vacuum", "after_vacuum_full")
    rows = [
        [name] + [f"{sizes[s]['rows'][name]:,} / {mb(sizes[s]['bytes'][name])}" for s in stages]
        for name in sizes["before"]["rows"]
    ]
    rows.append(["database"] + [mb(sizes[s]["database"]) for s in stages])
    prune = result["prune"]
    head = (
        f"{result['runs']:,} old terminal runs + {result['recent']} recent + {result['live']} "
        f"live on {result['database']}; prune: {prune['runs']:,} runs in {prune['batches']} "
        f"batches, {prune['seconds']:.1f} s, {prune.get('artifacts', 0)} artifacts deleted"
    )
    parts = [head, fmt.table(["table (rows / MB)", *stages], rows)]
    load = result["load"]
    phases = ("idle", "during_prune", "after_prune", "during_cpu_hog")
    rows = [
        [key.replace("_", " ")]
        + [fmt.num(load[phase][key], "ms") for phase in phases]
        + [fmt.num(load[f"{phase}_ratio"][key], "x") for phase in phases[1::2]]
        for key in ("sweep_median", "sweep_p95", "metrics_median", "metrics_p95")
    ]
    counts = " / ".join(str(load[phase]["n"]) for phase in phases)
    header = ["no prune", "during prune", "after", "one core busy", "prune ratio", "busy ratio"]
    parts.append(fmt.table([f"pass (n {counts})", *header], rows))
    parts.append(
        f"sweep passes that skipped a locked run: {load['busy_passes']}; the prune process "
        f"used {prune['process_cpu_seconds']} s of CPU over its {prune['seconds']:.1f} s"
    )
    read = result["reads"]
    big = f"{read['artifact_bytes'] / 1e6:g} MB"
    rows = [
        [f"Orchestrator.get, output a {big} artifact", fmt.num(read["get_artifact"], "ms")],
        ["Orchestrator.get, output inline 1 KB", fmt.num(read["get_inline"], "ms")],
        [f"Orchestrator.get, output inline {big}", fmt.num(read["get_inline_big"], "ms")],
        ["GET /runs/{id}, the artifact run (API)", fmt.num(read["get_api_artifact"], "ms")],
        ["GET .../steps/review/output, streamed", fmt.num(read["download"], "ms")],
        ["download MB/s", f"{read['download_mb_s']:.1f}"],
    ]
    parts.append(fmt.table([f"read ({read['artifact_bytes'] / 1e6:g} MB)", "median"], rows))
    return "\n\n".join(parts)


def mb(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.1f}"


def parser() -> argparse.ArgumentParser:
    """The command's options (``tests/unit/test_upkeep_bench.py`` parses its tiny run)."""
    found = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    found.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    found.add_argument("--runs", type=int, default=100000, help="old terminal runs")
    found.add_argument("--recent", type=int, default=300, help="runs ended a day ago")
    found.add_argument("--live", type=int, default=1000, help="running runs")
    found.add_argument("--samples", type=int, default=30, help="sweep passes with no prune")
    found.add_argument("--repeat", type=int, default=20, help="reads of each run")
    found.add_argument("--downloads", type=int, default=5)
    found.add_argument("--artifact-mb", type=float, default=20.0)
    found.add_argument("--json", type=Path, help="write the figures here")
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    options = parser().parse_args(argv)
    result = measure(options)
    print(render(result))
    if options.json:
        options.json.parent.mkdir(parents=True, exist_ok=True)
        options.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
