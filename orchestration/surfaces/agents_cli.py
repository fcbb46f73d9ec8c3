"""CLI commands for the operator's agent registry: ``orchestration agents add|list|show|remove``.

Operator commands: they write the database directly, as ``db upgrade`` and ``prune`` do
(:mod:`orchestration.workflows.agents` holds the rules).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError, ValidationError
from orchestration.surfaces.cli_common import console, dump, failed
from orchestration.workflows import agents

agents_app = typer.Typer(
    help="The operator's agent registry.\n\nThe agents that steps name (agent: NAME).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
_out = console()

Name = Annotated[str, typer.Argument(help="The agent's name, as steps say it (agent: NAME).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for programs.")]


def _executor() -> Any:
    from orchestration.core.db import check_ready
    from orchestration.core.settings import get_settings
    from orchestration.runtime.executor import Executor
    from orchestration.runtime.readiness import require_database

    settings = get_settings()
    require_database(settings.database_url)
    check_ready(settings.database_url)
    return Executor(settings, None)


def _option(text: str) -> tuple[str, Any]:
    """``k=v``: the value as JSON when it parses as JSON, else as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValidationError("option", f"{text!r} must be KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


@agents_app.command("add")
def add(
    name: Name,
    provider: Annotated[str, typer.Option(help="How it is reached: a2a, mcp, langgraph or http.")],
    url: Annotated[str, typer.Option(help="Its URL (checked against ORCH_PROVIDER_HOSTS).")],
    secret: Annotated[
        str | None,
        typer.Option(help="The secret its calls carry (declared in ORCH_PROVIDER_SECRETS)."),
    ] = None,
    option: Annotated[
        list[str] | None,
        typer.Option(help="A default with: option for its steps, KEY=VALUE (VALUE may be JSON)."),
    ] = None,
    pin: Annotated[
        bool, typer.Option("--pin", help="Pin every step that names it to its launch version.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Register an agent, or replace the one of that name.

    Its URL must be inside ORCH_PROVIDER_HOSTS and its secret declared for that host:
    the entry is what tenants may reach."""
    from orchestration.core.db import utcnow
    from orchestration.core.followups import Done

    try:
        entry = agents.Entry(
            name, provider, url, secret, dict(_option(o) for o in option or []), pin
        )
        transact = _executor()
        settings = transact.settings
        new = transact(lambda session: Done(agents.add(session, settings, entry, utcnow())))
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({**_shown(entry), "new": new})
        return
    _out.print(f"{'added' if new else 'replaced'} agent {name} ({provider} at {url})")


def _shown(entry: agents.Entry) -> dict[str, Any]:
    return entry.snapshot()


@agents_app.command("list")
def list_agents(as_json: AsJson = False) -> None:
    """List the registered agents."""
    from orchestration.core.followups import Done

    try:
        found = _executor()(lambda session: Done(agents.listing(session)))
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump([_shown(entry) for entry in found])
        return
    table = Table("agent", "provider", "url", "secret", "pin")
    for entry in found:
        table.add_row(
            Text(entry.name),
            entry.provider,
            Text(entry.url),
            Text(entry.secret or "-"),
            "yes" if entry.pin else "no",
        )
    _out.print(table)


@agents_app.command("show")
def show(name: Name, as_json: AsJson = False) -> None:
    """Show one agent: its provider, URL, secret's name, options and pin."""
    from orchestration.core.followups import Done

    try:
        entry = _executor()(lambda session: Done(agents.get(session, name)))
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump(_shown(entry))
        return
    for key, value in _shown(entry).items():
        shown = json.dumps(value) if isinstance(value, dict) else str(value)
        _out.print(Text(f"{key:9} {shown}"))


@agents_app.command("remove")
def remove(name: Name) -> None:
    """Forget an agent. Runs launched with it keep what they were launched with; new
    launches that name it are refused."""
    from orchestration.core.followups import Done

    try:
        gone = _executor()(lambda session: Done(agents.remove(session, name)))
        if not gone:
            raise ValidationError("agent", f"no agent is registered as {name!r}")
    except OrchestrationError as exc:
        raise failed(exc, False) from None
    _out.print(f"removed agent {name}")


def register_commands(app: typer.Typer) -> None:
    """Add ``agents`` to the main CLI."""
    app.add_typer(agents_app, name="agents")
