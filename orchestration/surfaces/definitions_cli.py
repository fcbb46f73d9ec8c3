"""CLI commands for registered workflows: ``orchestration workflows register|list|show``.

``orchestration launch research`` (or ``research@3``) then launches the stored version.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError, ValidationError
from orchestration.surfaces.cli_common import (
    AsJson,
    Owner,
    console,
    dump,
    failed,
    orchestrator_and_owner,
)

workflows_app = typer.Typer(
    help="Registered workflow definitions (name@version).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
_out = console()


@workflows_app.command("register")
def register(
    file: Annotated[str, typer.Argument(help="Workflow file (YAML or JSON).")],
    shared: Annotated[
        bool, typer.Option("--shared", help="Publish it for every owner (an operator's call).")
    ] = False,
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """Store a definition as the next version of its name.

    The same content again is a no-op that prints the version it already is."""
    from orchestration.workflows import load_file

    try:
        orch, who = orchestrator_and_owner(owner)
        found, created = orch.register_workflow(load_file(file), owner=who, shared=shared)
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({**found.summary(), "created": created})
        return
    said = "registered" if created else "unchanged:"
    _out.print(f"{said} {found.ref}  sha256:{found.sha256[:12]}")


@workflows_app.command("list")
def list_workflows(owner: Owner = None, as_json: AsJson = False) -> None:
    """List the owner's definitions and the published ones.

    Every version, newest first."""
    try:
        orch, who = orchestrator_and_owner(owner)
        found = orch.workflows(owner=who)
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump([one.summary() for one in found])
        return
    table = Table("workflow", "steps", "args", "sha256", "scope", "registered")
    for one in found:
        args = sorted((one.definition.get("args_schema") or {}).get("properties", {}))
        table.add_row(
            Text(one.ref),
            str(len(one.definition["steps"])),
            Text(", ".join(args) or "-"),
            one.sha256[:12],
            "shared" if one.shared else "own",
            one.created_at.isoformat(timespec="seconds"),
        )
    _out.print(table)


@workflows_app.command("show")
def show(
    ref: Annotated[str, typer.Argument(help="NAME (the latest version) or NAME@VERSION.")],
    owner: Owner = None,
) -> None:
    """The stored definition, as JSON (what a launch of it runs)."""
    who = None
    try:
        orch, who = orchestrator_and_owner(owner)
        found = orch.workflow(ref, owner=who)
    except ValidationError as exc:
        raise failed(exc, True, owner=who if exc.field == "workflow" else None) from None
    except OrchestrationError as exc:
        raise failed(exc, True) from None
    dump({**found.summary(), "definition": found.definition})


def register_commands(app: typer.Typer) -> None:
    """Add ``workflows`` to the main CLI."""
    app.add_typer(workflows_app, name="workflows")
