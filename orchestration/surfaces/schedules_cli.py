"""CLI commands for workflow schedules: ``orchestration schedules list|pause|resume|fire``.

A schedule is the ``schedule:`` of the latest registered version of an owner's definition;
the beat fires it (``orchestration.upkeep.schedules``).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError
from orchestration.surfaces.cli_common import (
    AsJson,
    Owner,
    console,
    dump,
    failed,
    orchestrator_and_owner,
)

schedules_app = typer.Typer(
    help="Workflow schedules: next fires, last fires, pause and resume.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
_out = console()

Name = Annotated[str, typer.Argument(help="The registered workflow's name.")]


@schedules_app.command("list")
def list_schedules(owner: Owner = None, as_json: AsJson = False) -> None:
    """List the owner's schedules, their next and last fires.

    Paused or not, and the runs the last fires made."""
    try:
        orch, who = orchestrator_and_owner(owner)
        found = orch.schedules(owner=who)
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump(found)
        return
    table = Table("schedule", "when", "overlap", "state", "next fire", "last fires")
    for one in found:
        spec = one["schedule"]
        when = spec.get("cron") or f"every {spec['every']}s"
        last = "\n".join(
            f"{fire['fire_at']} {fire['status']} {fire['run_id'] or fire['reason'] or ''}"
            for fire in one["last_fires"][:3]
        )
        table.add_row(
            Text(one["ref"]),
            f"{when} ({spec['timezone']})",
            spec["overlap"],
            "paused" if one["paused"] else "active",
            one["next_fires"][0] if one["next_fires"] else "-",
            Text(last or "-"),
        )
    _out.print(table)


def _switch(name: str, owner: str | None, *, paused: bool) -> None:
    try:
        orch, who = orchestrator_and_owner(owner)
        switch = orch.pause_schedule if paused else orch.resume_schedule
        changed = switch(name, owner=who)
    except OrchestrationError as exc:
        raise failed(exc, False) from None
    state = "paused" if paused else "resumed"
    _out.print(f"{state} {name}" if changed else f"{name} was already {state}")


@schedules_app.command("pause")
def pause(name: Name, owner: Owner = None) -> None:
    """Pause a schedule: nothing fires until it is resumed.

    Its fires are neither recorded nor launched meanwhile."""
    _switch(name, owner, paused=True)


@schedules_app.command("resume")
def resume(name: Name, owner: Owner = None) -> None:
    """Resume a paused schedule.

    Fires missed meanwhile inside its catchup_window are launched, older ones recorded as
    skipped."""
    _switch(name, owner, paused=False)


@schedules_app.command("fire")
def fire() -> None:
    """Fire every owner's due schedules now, as the beat does.

    Prints the pass's counts as JSON."""
    from orchestration.upkeep import schedules

    try:
        orch, _ = orchestrator_and_owner(None)
        report = schedules.fire(orch.transact, orch.settings, orch.clock())
    except OrchestrationError as exc:
        raise failed(exc, True) from None
    dump(report)


def register_commands(app: typer.Typer) -> None:
    """Add ``schedules`` to the main CLI."""
    app.add_typer(schedules_app, name="schedules")
