"""CLI commands for the HTTP surface: ``orchestration api`` and ``orchestration tokens``.

Registered on the main typer app by :func:`register`; the heavy imports (FastAPI, uvicorn)
happen inside the commands, so the rest of the CLI starts as fast as before.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError, ValidationError
from orchestration.observability import logs
from orchestration.surfaces.cli_common import console, err, failed

tokens_app = typer.Typer(
    help="API tokens (bearer tokens that act as an owner).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
_out = console()


def _fail(exc: OrchestrationError) -> typer.Exit:
    return failed(exc, False)


def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Serve the HTTP API, the dashboard and /metrics (uvicorn)."""
    import uvicorn

    from orchestration.surfaces.api.app import create_app

    try:
        app = create_app()
    except OrchestrationError as exc:
        raise _fail(exc) from None
    if app.state.orchestrator.settings.log_format == "json":
        # uvicorn's own config would give its loggers text handlers; theirs go to the root.
        logs.configure("json", logging.getLevelName(log_level.upper()))
        uvicorn.run(app, host=host, port=port, log_level=log_level, log_config=None)
    else:
        uvicorn.run(app, host=host, port=port, log_level=log_level)


@tokens_app.command("create")
def create(
    owner: Annotated[
        str | None, typer.Option("--owner", help="The owner the token acts as.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="A label, e.g. ci or alice.")] = None,
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="An operator's token (no --owner; --name is journalled): reads and cancels "
            "every owner's runs and suspends owners under /operator.",
        ),
    ] = False,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from orchestration.core.db import session_scope, utcnow
    from orchestration.core.settings import get_settings
    from orchestration.surfaces.api import tokens

    url = get_settings().database_url
    try:
        if owner is None and not operator:
            raise ValidationError(
                "owner", "give --owner NAME (the owner the token acts as) or --operator"
            )
        tokens.check_ready(url)
        with session_scope(url) as session:
            token = tokens.create(session, owner, name, now=utcnow(), operator=operator)
    except OrchestrationError as exc:
        raise _fail(exc) from None
    sys.stdout.write(token + "\n")
    holder = ("operator ", ("" if name is None else name, "bold"))
    if not operator:
        holder = ("owner ", ("" if owner is None else owner, "bold"))
    err.print(
        Text.assemble("token for ", *holder, " created; it is shown only now, store it safely")
    )


@tokens_app.command("list")
def list_tokens(
    owner: Annotated[str | None, typer.Option("--owner", help="Only this owner's.")] = None,
) -> None:
    """List tokens by id, owner, name and state; never the tokens.

    The id is a prefix of the token's hash."""
    from orchestration.core.db import session_scope
    from orchestration.core.settings import get_settings
    from orchestration.surfaces.api import tokens

    url = get_settings().database_url
    try:
        tokens.check_ready(url)
        with session_scope(url) as session:
            rows = tokens.listing(session, owner)
    except OrchestrationError as exc:
        raise _fail(exc) from None
    table = Table("id", "owner", "name", "created", "revoked")
    for row in rows:
        table.add_row(
            row.token_hash[:12],
            Text("(operator)" if row.operator else row.owner),
            Text(row.name or "-"),
            row.created_at.isoformat(timespec="seconds"),
            row.revoked_at.isoformat(timespec="seconds") if row.revoked_at else "-",
        )
    _out.print(table)


@tokens_app.command("revoke")
def revoke(
    token: Annotated[str, typer.Argument(help="The token, or its id from `tokens list`.")],
) -> None:
    """Revoke a token: requests with it get 401 from now on (idempotent)."""
    from orchestration.core.db import session_scope, utcnow
    from orchestration.core.settings import get_settings
    from orchestration.surfaces.api import tokens

    url = get_settings().database_url
    try:
        tokens.check_ready(url)
        with session_scope(url) as session:
            row = tokens.revoke(session, token, now=utcnow())
            ident, owner = row.token_hash[:12], row.owner
    except OrchestrationError as exc:
        raise _fail(exc) from None
    _out.print(f"token {ident} of owner {owner} revoked")


def register(app: typer.Typer) -> None:
    """Add ``api`` and ``tokens`` to the main CLI."""
    app.command("api")(serve)
    app.add_typer(tokens_app, name="tokens")
