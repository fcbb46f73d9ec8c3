"""Pricing a suggested engine change in a real worker (not part of ``make bench``).

    python -m bench.experiments [--links 200 20] [--repeats 3]

Runs the step-overhead measurement (item 1) on one stack with the worker as shipped
(``-A bench.bare_app``) and with ``Run.steps`` loaded lazily (``-A bench.lazy_app``), the two
workers alternating round by round on the same database and queue, and writes per-link
medians and their ratio to ``bench-results/experiments.json``, which ``docs/benchmarks.md``
quotes the next time it is written (``make bench``, or ``python -m bench --render
bench-results/report.json``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import overhead, stats
from bench.__main__ import DEFAULT_POSTGRES, DEFAULT_REDIS
from bench.stack import claim_redis, make_stack, release_redis, remove_tree
from orchestration.core.models import Run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", type=int, nargs="+", default=[200, 20])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis", default=DEFAULT_REDIS)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES)
    parser.add_argument("--out", type=Path, default=Path("bench-results/experiments.json"))
    options = parser.parse_args()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    client = claim_redis(options.redis)
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-exp-"))
    variants = (("as_shipped", "bench.bare_app"), ("steps_lazy", "bench.lazy_app"))
    per_link: dict[tuple[str, str], list[float]] = {}
    busy: dict[tuple[str, str], list[float]] = {}
    try:
        stack = make_stack(options.postgres, options.redis, tmp, "experiment")
        try:
            # Rounds alternate the two workers, so drift on the shared machine hits both.
            for _ in range(options.repeats):
                for label, app in variants:
                    worker = stack.start_worker(app=app)
                    for links in options.links:
                        measured = overhead.step_overhead(stack, links, repeats=1, bare_repeats=1)
                        key = (str(links), label)
                        per_link.setdefault(key, []).append(measured["engine_per_link_s"]["median"])
                        busy.setdefault(key, []).append(measured["engine_execution_busy_s"]["p50"])
                    worker.stop()
                    stack.processes.remove(worker)
        finally:
            stack.close()
    finally:
        release_redis(client)
        remove_tree(tmp)
    results: dict[str, Any] = {}
    for (links, label), samples in per_link.items():
        results.setdefault(links, {})[label] = {
            "engine_per_link_s": stats.spread(samples),
            "engine_execution_busy_s": {"p50": stats.median(busy[(links, label)])},
        }
    for data in results.values():
        shipped = data["as_shipped"]["engine_per_link_s"]["median"]
        lazy = data["steps_lazy"]["engine_per_link_s"]["median"]
        data["lazy_over_shipped"] = stats.ratio(lazy, shipped)
    document = {
        "started": started,
        "repeats": options.repeats,
        "shipped_steps_loading": Run.__mapper__.relationships["steps"].lazy,
        "step_overhead": results,
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
