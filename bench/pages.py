"""Dashboard page load times at 10,000 runs (issue 14's closing figure): the owner's runs page,
the operator's every-owner runs page, a run page and the fleet page, served in-process.

    python -m bench.pages --database-url postgresql://postgres@127.0.0.1:5432/test

A database of its own (dropped at the end) is seeded with the rows ``bench.upkeep`` writes:
runs that ended in the last day, and live ones, over four owners. Each page is fetched through
the real app (``TestClient``: routing, auth, templates; no socket), median and p95 of the
repeats; the fleet page's broker questions (queue depth, worker pools) are included, with no
worker answering, so it waits the probe's timeout for the pools: that is reported apart.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from bench import stats
from bench.scratch import scratch_database
from bench.upkeep_rows import OWNERS, seed
from orchestration.core.db import session_scope, utcnow
from orchestration.core.settings import Settings
from orchestration.runtime import broker_probe
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app


def timed(client: TestClient, path: str, repeat: int) -> dict[str, float]:
    """Median and p95 (ms) of ``repeat`` loads of ``path`` after one warm-up."""
    assert client.get(path).status_code == 200, path
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        reply = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        assert reply.status_code == 200, path
    return {"median_ms": stats.median(samples), "p95_ms": stats.percentile(samples, 95)}


def measure(options: argparse.Namespace) -> dict[str, Any]:
    """Seed, then time each page; the figures as a dict."""
    with scratch_database(options.database_url, "pages") as url:
        settings = Settings(database_url=url, broker_url=options.broker_url)
        now = utcnow()
        ended = options.runs - options.live
        seeded = seed(settings.database_url, 0, ended, options.live, now - timedelta(minutes=30))
        orch = Orchestrator(settings, None)
        with session_scope(settings.database_url) as session:
            owner = tokens.create(session, OWNERS[0], "bench", now=now)
            operator = tokens.create(session, None, "bench-operator", now=now, operator=True)
        app = create_app(orch)
        mine = TestClient(app, headers={"Authorization": f"Bearer {owner}"})
        everyone = TestClient(app, headers={"Authorization": f"Bearer {operator}"})
        run_id = seeded.survivors[0]
        pages = {
            "runs page (one owner)": timed(mine, "/dashboard", options.repeat),
            "runs page (operator, every owner)": timed(everyone, "/dashboard", options.repeat),
            "run page": timed(everyone, f"/dashboard/runs/{run_id}", options.repeat),
            "fleet page": timed(everyone, "/dashboard/fleet", options.repeat),
        }
        started = time.perf_counter()
        broker_probe.ask_pools(settings)
        return {
            "database": settings.database_url.split(":", 1)[0],
            "runs": options.runs,
            "live": options.live,
            "pages": pages,
            "fleet_pools_wait_ms": (time.perf_counter() - started) * 1000,
        }


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    lines = [
        f"{result['runs']:,} runs ({result['live']:,} live) on {result['database']}",
        "",
        "| page | median | p95 |",
        "|---|---|---|",
    ]
    for page, figures in result["pages"].items():
        lines.append(f"| {page} | {figures['median_ms']:.1f} ms | {figures['p95_ms']:.1f} ms |")
    lines.append(
        f"\nasking the workers for their pools (the fleet page's first load; the answer is "
        f"then kept {broker_probe.POOLS_FRESH:.0f} s): {result['fleet_pools_wait_ms']:.0f} ms"
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    found = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    found.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    found.add_argument("--broker-url", default="redis://127.0.0.1:6379/13")
    found.add_argument("--runs", type=int, default=10000)
    found.add_argument("--live", type=int, default=1000)
    found.add_argument("--repeat", type=int, default=20)
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    result = measure(parser().parse_args(argv))
    print(render(result))
    return result


if __name__ == "__main__":
    main()
