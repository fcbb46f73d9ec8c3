"""``python -m bench --report bench-results/report.json``: every benchmark, one report.

Runs items 1-7 of the benchmark plan, each group on its own isolated stack (fresh database,
own queue, own prefork worker on the benchmark's Redis db), writes the JSON report, and
regenerates ``docs/benchmarks.md`` and its ``docs/benchmarks-*.png`` figures. A failing item
is recorded under ``errors`` and the others still run; the exit status is then 1.

Issue 11's targets (``bench.targets``) are computed from this run's figures and from the
baseline's (``--baseline``, the engine before the change measured on this machine), into the
report's ``targets`` and the table at the top of the doc.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import celery

from bench import (
    cancel,
    fanout,
    findings,
    launch,
    messages,
    overhead,
    profiling,
    report,
    scale,
    spy,
    sweep,
    targets,
)
from bench.peers import lineup
from bench.stack import ROOT, Stack, claim_redis, make_stack, release_redis, remove_tree

DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
#: The engine before issue 11 (commit 971f8fd), measured on this machine with ``--quick``.
BASELINE = ROOT / "bench" / "baseline" / "971f8fd.json"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, default=Path("bench-results/report.json"))
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where the doc goes")
    parser.add_argument("--redis", default=DEFAULT_REDIS, help="a Redis db the bench may flush")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="admin URL; makes its DBs")
    parser.add_argument("--director-venv", type=Path, default=Path("/tmp/director-venv"))
    parser.add_argument("--dbos-venv", type=Path, default=Path("/tmp/dbos-venv"))
    parser.add_argument("--prefect-venv", type=Path, default=Path("/tmp/prefect-venv"))
    parser.add_argument(
        "--peers",
        default=",".join(lineup.NAMES),
        help="the peers item 1 times when `peer` is wanted, comma-separated (default: all of "
        + ",".join(lineup.NAMES)
        + ")",
    )
    parser.add_argument(
        "--prefect-database",
        choices=lineup.PREFECT_DATABASES,
        default="sqlite",
        help="the database of Prefect's ephemeral server: SQLite (Prefect's default) or a "
        "fresh one on --postgres",
    )
    parser.add_argument("--quick", action="store_true", help="skip the 1,000,000-row sweep")
    parser.add_argument(
        "--baseline", type=Path, default=BASELINE, help="the before figures of the targets"
    )
    parser.add_argument(
        "--render", type=Path, help="only rewrite the docs from this existing JSON report"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated subset: "
        "overhead,hop,scale,cancel,fanout,sweep,launch,peer,profile,messages",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.peers.split(",")) - set(lineup.NAMES) - {""})
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; known: {', '.join(lineup.NAMES)}")
    return args


def _peer_options(args: argparse.Namespace) -> lineup.Options:
    return lineup.Options(
        names=tuple(name for name in args.peers.split(",") if name),
        director_venv=args.director_venv,
        dbos_venv=args.dbos_venv,
        prefect_venv=args.prefect_venv,
        prefect_database=args.prefect_database,
    )


class Runner:
    """Runs items, timing each and keeping going past a failure."""

    def __init__(self, only: set[str]) -> None:
        self.only = only
        self.results: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.seconds: dict[str, float] = {}

    def wanted(self, item: str) -> bool:
        return not self.only or item in self.only

    def item(self, name: str, call: Callable[[], Any], into: str | None = None) -> None:
        started = time.monotonic()
        print(f"[bench] {name} ...", flush=True)
        try:
            value = call()
        except Exception:
            self.errors[name] = traceback.format_exc()
            print(f"[bench] {name} FAILED:\n{self.errors[name]}", flush=True)
        else:
            if into is None:
                self.results[name] = value
            else:
                self.results.setdefault(into, {})[name.split(":", 1)[1]] = value
        self.seconds[name] = round(time.monotonic() - started, 1)
        print(f"[bench] {name} done in {self.seconds[name]} s", flush=True)


def _stack(args: argparse.Namespace, tmp: Path, label: str, *, sqlite: bool = False) -> Stack:
    return make_stack(None if sqlite else args.postgres, args.redis, tmp, label)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _experiments(report_path: Path) -> dict[str, Any] | None:
    """``bench.experiments``' last results, kept beside the report, if any."""
    path = report_path.parent / "experiments.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _carry_sweep(result: dict[str, Any], previous: Path) -> None:
    """Without its own 1,000,000-row sweep (``--quick``), keep the last full run's row."""
    rows = result.get("sweep") or []
    if not rows or rows[-1]["terminal"] >= targets.SWEEP_TARGET_ROWS or not previous.exists():
        return
    try:
        old = json.loads(previous.read_text())
    except ValueError:
        return
    old_rows = old.get("sweep") or []
    if old_rows and old_rows[-1]["terminal"] >= targets.SWEEP_TARGET_ROWS:
        meta = old.get("meta") or {}
        result["sweep_1m_carried"] = {
            "row": old_rows[-1],
            "base_seconds": old_rows[0]["median_seconds"],
            "commit": meta.get("commit", "unknown"),
            "started": meta.get("started", "?"),
        }
    elif old.get("sweep_1m_carried"):
        result["sweep_1m_carried"] = old["sweep_1m_carried"]


def _targets(result: dict[str, Any], args: argparse.Namespace) -> None:
    baseline = targets.load_baseline(args.baseline)
    result["targets"] = {
        "baseline": _shown(args.baseline),
        "baseline_commit": args.baseline.stem,
        "rows": targets.evaluate(result, baseline),
    }


def _write_docs(result: dict[str, Any], args: argparse.Namespace) -> None:
    args.docs.mkdir(parents=True, exist_ok=True)
    _targets(result, args)
    figures = report.plots(result, args.docs)
    markdown = report.render(result, _experiments(args.render or args.report))
    page = args.docs / "benchmarks.md"
    kept = report.kept_sections(page.read_text() if page.exists() else "")
    page.write_text(markdown.rstrip("\n") + "\n" + kept if kept else markdown)
    print(f"[bench] wrote {args.docs / 'benchmarks.md'} and {', '.join(figures)}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.render is not None:
        _write_docs(json.loads(args.render.read_text()), args)
        return 0
    run = Runner({item for item in args.only.split(",") if item})
    begun = time.monotonic()
    meta = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "celery": celery.__version__,
        "postgres": args.postgres,
        "redis": args.redis,
        "quick": args.quick,
        "load_before": " / ".join(f"{value:.2f}" for value in os.getloadavg()),
        "shared_machine": True,
        "run_steps_loading": findings.steps_loading({"meta": {}}),
    }
    redis_client = claim_redis(args.redis)
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    try:
        if any(run.wanted(item) for item in ("overhead", "hop", "cancel", "profile", "messages")):
            stack = _stack(args, tmp, "main")
            try:
                stack.start_worker()
                if run.wanted("overhead"):
                    with contextlib.ExitStack() as up:
                        peers = None
                        if run.wanted("peer"):
                            peers = up.enter_context(
                                lineup.started(
                                    _peer_options(args), args.postgres, args.redis, tmp, 200
                                )
                            )
                        run.item(
                            "step_overhead:200",
                            lambda: overhead.step_overhead(
                                stack,
                                200,
                                repeats=3,
                                bare_repeats=5,
                                peers=peers.contestants() if peers is not None else (),
                            ),
                            into="step_overhead",
                        )
                        if peers is not None:
                            run.results.update(peers.results(interleaved=True))
                    run.item(
                        "step_overhead:20",
                        lambda: overhead.step_overhead(stack, 20, repeats=3, bare_repeats=5),
                        into="step_overhead",
                    )
                if run.wanted("hop"):
                    run.item(
                        "poll_hop", lambda: overhead.poll_hop(stack, [0.01, 0.1], 20, repeats=5)
                    )
                if run.wanted("profile"):
                    run.item("profile:redis", lambda: spy.redis_commands(stack), "profile")
                    run.item(
                        "profile:worker_py_spy",
                        lambda: spy.worker_profile(stack, 200, 8),
                        "profile",
                    )
                if run.wanted("messages"):
                    run.item(
                        "messages:per_step",
                        lambda: messages.per_step(stack, list(messages.LENGTHS)),
                        "messages",
                    )
                if run.wanted("cancel"):
                    run.item("cancel:postgresql", lambda: cancel.run(stack, 60, 20), into="cancel")
            finally:
                stack.close()
        if run.wanted("cancel"):
            stack = _stack(args, tmp, "sqlite", sqlite=True)
            try:
                stack.start_worker()
                run.item("cancel:sqlite", lambda: cancel.run(stack, 60, 20), into="cancel")
            finally:
                stack.close()
        if run.wanted("fanout"):
            stack = _stack(args, tmp, "fanout")
            try:
                stack.start_worker()
                run.item("fanout", lambda: fanout.run(stack, branches=100, concurrency=10))
            finally:
                stack.close()
        if run.wanted("scale"):
            stack = _stack(args, tmp, "scale")
            try:
                stack.start_worker()
                run.item(
                    "scale",
                    lambda: scale.run(
                        stack,
                        runs=1000,
                        interval=5.0,
                        window=15.0,
                        parts=3,
                        saturation_runs=100,
                        saturation_window=9.0,
                        half_window=15.0,
                    ),
                )
            finally:
                stack.close()
        if any(run.wanted(item) for item in ("launch", "profile", "messages")):
            stack = _stack(args, tmp, "launch")  # no worker: launches are not executed
            try:
                if run.wanted("launch"):
                    run.item("launch:python", lambda: launch.python_api(stack, 200), "launch")
                    run.item("launch:http", lambda: launch.http_api(stack, 200), "launch")
                if run.wanted("profile"):
                    run.item(
                        "profile:statements",
                        lambda: profiling.statements_per_execution(stack, [1, 20, 200]),
                        "profile",
                    )
                    run.item(
                        "profile:launch_statements",
                        lambda: profiling.launch_statements(stack, [3, 200]),
                        "profile",
                    )
                    run.item(
                        "profile:instant",
                        lambda: profiling.instant_steps(stack, 200),
                        "profile",
                    )
                    run.item("profile:cpu", lambda: profiling.cpu_profile(stack, 200, 5), "profile")
                if run.wanted("messages"):
                    run.item(
                        "messages:segments",
                        lambda: messages.segments(stack, [2, 8, 9, 50, 200]),
                        "messages",
                    )
            finally:
                stack.close()
        if run.wanted("peer") and not run.wanted("overhead"):
            run.item(
                "peer",
                lambda: lineup.run_alone(
                    _peer_options(args), args.postgres, args.redis, tmp, 200, 3
                ),
            )
            # The item's value holds the report's ``peer`` and ``peers`` entries.
            run.results.update(run.results.pop("peer", {}))
        if run.wanted("sweep"):
            sizes = [0, 10_000, 100_000] + ([] if args.quick else [1_000_000])
            run.item(
                "sweep",
                lambda: [sweep.measure(args.postgres, n, 1000, 5) for n in sizes],
            )
    finally:
        release_redis(redis_client)
        remove_tree(tmp)
    meta["load_after"] = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    result = {
        "meta": meta,
        **run.results,
        "errors": run.errors,
        "item_seconds": run.seconds,
        "runtime_s": round(time.monotonic() - begun, 1),
    }
    _carry_sweep(result, args.report)
    if not run.only:
        _write_docs(result, args)  # and the targets, into the report
    else:
        _targets(result, args)
    report.write_json(result, args.report)
    print(f"[bench] wrote {args.report} in {result['runtime_s'] / 60:.1f} min", flush=True)
    return 1 if run.errors else 0


def _shown(path: Path) -> str:
    """``path`` as the docs show it: relative to the repository when it is inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    raise SystemExit(main())
