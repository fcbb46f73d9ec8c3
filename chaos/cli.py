"""``python -m chaos``: run the chaos suite, print the figures, write the report.

Exit status: 0 when every must-be-zero figure is 0; 1 when one is not; 2 when the run could not
be carried out (a service missing, a bad option).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from chaos.faults import KINDS
from chaos.hostile import sized
from chaos.latency import comparison
from chaos.profiles import PROFILES
from chaos.report import table, update_doc, write_json
from chaos.runner import Options, log, run

DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/test"


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Launch a mixed population of runs against real services, inject faults, "
        "and check that every run ends by its deadline with no illegal transition, no "
        "duplicate provider turn and no lost run.",
    )
    parse.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="full",
        help="population size and time limit (full: 300 runs; ci: 80 runs under 5 minutes)",
    )
    parse.add_argument("--runs", type=int, help="number of runs (scales the profile's window)")
    parse.add_argument("--seed", type=int, help="seed of the plan (default: random, printed)")
    parse.add_argument(
        "--broker",
        default="own-redis",
        help="own-redis (a private redis-server this run may restart), redis://..., or "
        "amqp://... (a private vhost on a local node; default: own-redis)",
    )
    parse.add_argument(
        "--database",
        default=os.environ.get("ORCH_TEST_DATABASE_URL", DEFAULT_DATABASE),
        help="PostgreSQL server URL; a fresh database is created on it and dropped after "
        f"(default: $ORCH_TEST_DATABASE_URL or {DEFAULT_DATABASE})",
    )
    parse.add_argument("--duration-limit", type=float, help="seconds the whole run may take")
    parse.add_argument(
        "--report", type=Path, default=Path("chaos-report.json"), help="JSON report path"
    )
    parse.add_argument("--doc", type=Path, help="update the results table of this Markdown file")
    parse.add_argument(
        "--faults",
        help=f"comma-separated fault kinds to inject (default: all of {', '.join(KINDS)})",
    )
    parse.add_argument("--keep-logs", action="store_true", help="keep the worker logs folder")
    parse.add_argument(
        "--plain", action="store_true", help="the plain population alone, without hostile owners"
    )
    parse.add_argument(
        "--hostile-sizes",
        default="",
        help="override the profile's hostile sizes, e.g. storm_schedules=100,owner_runs=20 "
        "(agent_runs, storm_schedules, fanouts, branches, owner_runs)",
    )
    parse.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the plain pass that the full profile runs first to compare step latency",
    )
    return parse


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    profile = PROFILES[args.profile]
    if args.runs is not None:
        if args.runs < 10:
            parser().error("--runs must be at least 10")
        scale = args.runs / profile.runs
        profile = replace(
            profile,
            runs=args.runs,
            window=max(45.0, profile.window * scale),
            faults=max(10, round(profile.faults * scale)),
            duration_limit=max(180.0, profile.duration_limit * scale),
        )
    if args.hostile_sizes:
        try:
            profile = replace(profile, hostile=sized(profile.hostile, args.hostile_sizes))
        except ValueError as exc:
            parser().error(str(exc))
    if args.duration_limit is not None:
        profile = replace(profile, duration_limit=args.duration_limit)
    kinds = KINDS
    if args.faults:
        kinds = tuple(kind.strip() for kind in args.faults.split(",") if kind.strip())
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            parser().error(f"--faults: unknown kinds {unknown}; known: {', '.join(KINDS)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    log(f"seed {seed} (reproduce with --seed {seed})")
    options = Options(
        profile, seed, args.broker, args.database, args.keep_logs, kinds, hostile=not args.plain
    )
    baseline: dict[str, Any] | None = None
    try:
        if options.hostile and profile.baseline and not args.no_baseline:
            log("plain pass: the plain population alone, for the step latency it keeps")
            baseline = run(replace(options, hostile=False))
            write_json(baseline, args.report.with_name(f"{args.report.stem}-plain.json"))
            log("hostile pass: the same seed with hostile owners")
        report = run(options)
    except Exception:
        traceback.print_exc()
        log("the chaos run could not be carried out")
        return 2
    if baseline is not None:
        report["plain_latency"] = comparison(
            baseline["figures"]["plain_step_latency_s"], report["figures"]["plain_step_latency_s"]
        )
        report["failures"].update(
            {f"plain pass: {name}": value for name, value in baseline["failures"].items()}
        )
    write_json(report, args.report)
    print(table(report))
    print(f"report: {args.report}")
    if args.doc is not None:
        update_doc(report, args.doc)
    if report["failures"]:
        print(f"worker logs kept in {report['logs']}", file=sys.stderr)
        return 1
    return 0
