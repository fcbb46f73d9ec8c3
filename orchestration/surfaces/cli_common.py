"""What every CLI command shares: the ``--owner`` and ``--json`` options, JSON on stdout, and
one way to report an error (one line on stderr, JSON with ``--json``, exit status 2)."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from orchestration.errors import OrchestrationError, ValidationError

if TYPE_CHECKING:
    from orchestration.service import Orchestrator

err = Console(stderr=True)

Owner = Annotated[
    str | None, typer.Option("--owner", help="Owner of the runs (default: ORCH_OWNER).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for programs.")]


def dump(value: Any) -> None:
    """``value`` as indented JSON on stdout (times in ISO 8601)."""
    sys.stdout.write(json.dumps(value, indent=2, default=_default, ensure_ascii=False) + "\n")


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def one_line(text: str) -> str:
    """``text`` with every run of white space, line breaks included, one space."""
    return " ".join(text.split())


def error_line(message: str) -> None:
    """``error: message`` on stderr. Escaped, because a message may quote user input such as
    ``[/]``; never wrapped, so a program reading stderr gets exactly one line."""
    err.print(f"[red]error:[/] {escape(one_line(message))}", soft_wrap=True, highlight=False)


def failed(exc: OrchestrationError, as_json: bool) -> typer.Exit:
    """Report ``exc`` (JSON naming the field with ``--json``); the exit to raise (status 2)."""
    if as_json:
        body: dict[str, Any] = {"code": exc.code, "message": str(exc)}
        if isinstance(exc, ValidationError):
            body["field"] = exc.field
        sys.stderr.write(json.dumps({"error": body}) + "\n")
    else:
        error_line(str(exc))
    return typer.Exit(2)


def orchestrator_and_owner(owner: str | None) -> tuple[Orchestrator, str]:
    """The Python API from the environment, and who acts: ``--owner`` or ``ORCH_OWNER``.
    Imported late, so that ``--help`` loads neither the database layer nor the settings."""
    from orchestration.service import Orchestrator
    from orchestration.settings import get_settings

    return Orchestrator.from_env(), owner or get_settings().owner
