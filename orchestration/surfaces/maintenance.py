"""CLI commands for an operator's upkeep: ``orchestration sweep``, ``prune``, ``health`` and
``demo``.

Registered on the main typer app by :func:`register`. An error (a bad ``--older-than``) is
raised as an :class:`OrchestrationError`, which the CLI's entry point prints as one line with
exit status 2.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from typing import Annotated

import typer
from rich.text import Text

from orchestration.core.errors import OrchestrationError, ValidationError
from orchestration.surfaces.cli_common import AsJson, console, dump, failed

_out = console()
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s`` or plain seconds; more than zero."""
    found = _AGE.match(text.strip())
    if found is None or float(found.group(1)) <= 0:
        raise ValidationError("older_than", f"{text!r} is not an age such as 30d, 12h or 90m")
    return timedelta(seconds=float(found.group(1)) * _UNIT[found.group(2)])


def sweep(as_json: AsJson = False) -> None:
    """Run one sweeper pass now, as beat does periodically.

    Beat sends one every ORCH_SWEEP_INTERVAL."""
    from orchestration.core.db import check_ready
    from orchestration.core.settings import get_settings
    from orchestration.runtime.celery_queue import client_executor
    from orchestration.runtime.readiness import require_database
    from orchestration.upkeep.sweeper import Sweeper

    settings = get_settings()
    try:
        require_database(settings.database_url)
        check_ready(settings.database_url)
        report = Sweeper(settings, client_executor(settings)).sweep()
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump(report)
    else:
        _out.print(", ".join(f"{key}={value}" for key, value in report.items()))


def prune(
    older_than: Annotated[str, typer.Option(help="Delete runs that ended this long ago: 30d.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count, delete nothing.")] = False,
    batch: Annotated[int, typer.Option(min=1, help="Runs per transaction.")] = 500,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for programs.")] = False,
) -> None:
    """Delete the runs that ended before --older-than.

    Each run goes with all its rows, in bounded batches."""
    from orchestration.core.db import check_ready, utcnow
    from orchestration.core.settings import get_settings
    from orchestration.runtime.executor import Executor
    from orchestration.runtime.readiness import require_database
    from orchestration.upkeep import retention

    settings = get_settings()
    cutoff = utcnow() - age(older_than)
    require_database(settings.database_url)
    check_ready(settings.database_url)
    report = retention.prune(
        Executor(settings, None),
        cutoff=cutoff,
        batch=batch,
        dry_run=dry_run,
        artifact_dir=settings.artifact_dir,
    )
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        _out.print(", ".join(f"{key}={value}" for key, value in report.items()))


def health(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for programs.")] = False,
) -> None:
    """Check the database, broker and sweeper; exit 1 if one is down.

    A part that is down is named by its address (password masked) and the cause."""
    from orchestration.core.settings import get_settings
    from orchestration.runtime.liveness import check

    report = check(get_settings(), where=True)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        for name, part in report["checks"].items():
            mark = ("ok", "green") if part["ok"] else ("FAIL", "red")
            _out.print(Text.assemble(f"{name:10} ", mark, "  ", part["detail"]))
    if not report["ok"]:
        raise typer.Exit(1)


def demo(
    example: Annotated[
        str | None, typer.Option(help="Run examples/NAME.yaml to its end instead (shapes).")
    ] = None,
) -> None:
    """Run the demo: a worker, SQLite and an embedded broker.

    With --example NAME, run that example workflow instead."""
    from orchestration.surfaces.demo import run_demo

    raise typer.Exit(run_demo(_out, example))


def register(app: typer.Typer) -> None:
    """Add ``sweep``, ``prune``, ``health`` and ``demo`` to the main CLI."""
    app.command("sweep")(sweep)
    app.command("prune")(prune)
    app.command("health")(health)
    app.command("demo")(demo)
