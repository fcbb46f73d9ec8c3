"""What every CLI command shares: the ``--owner`` and ``--json`` options, JSON on stdout, the
consoles, and one way to report an error (one line on stderr, JSON with ``--json``, exit
status 2).

The consoles read no Rich markup: what they print comes from owners and their providers
(workflow names, errors, outputs, prompts), and a ``[/]`` in it must print as written, never
end a style, and a ``[link=...]`` never become a terminal hyperlink (issue 30). Styles are
given as :class:`~rich.text.Text` instead.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from orchestration.core.errors import (
    BrokerUnavailable,
    OrchestrationError,
    RunNotFound,
    ValidationError,
)

if TYPE_CHECKING:
    from orchestration.service import Orchestrator


def console(*, stderr: bool = False) -> Console:
    """A console that treats every string as plain text (no markup, no highlighting)."""
    return Console(stderr=stderr, markup=False, highlight=False)


err = console(stderr=True)

#: Exit status of a command that failed (its error is one line on stderr).
EXIT_ERROR = 2
#: Exit status of a launch whose run is saved but not sent: the broker did not answer. The
#: sweeper sends the run once the broker is back.
EXIT_NOT_SENT = 3

Owner = Annotated[
    str | None, typer.Option("--owner", help="Owner of the runs (default: ORCH_OWNER).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for programs.")]
RunId = Annotated[
    str, typer.Argument(metavar="RUN_ID", help="The run's id, as launch and runs print it.")
]


def dump(value: Any) -> None:
    """``value`` as indented JSON on stdout (times in ISO 8601)."""
    sys.stdout.write(json.dumps(value, indent=2, default=_default, ensure_ascii=False) + "\n")


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_arg(text: str | None, field: str) -> Any:
    """An option's JSON (``--args``, ``--value``); :class:`ValidationError` naming ``field``."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(field, f"is not valid JSON: {exc.msg}") from None


def one_line(text: str) -> str:
    """``text`` with every run of white space, line breaks included, one space."""
    return " ".join(text.split())


def error_line(message: str) -> None:
    """``error: message`` on stderr. Escaped, because a message may quote user input such as
    ``[/]``; never wrapped, so a program reading stderr gets exactly one line."""
    err.print(Text.assemble(("error:", "red"), " ", one_line(message)), soft_wrap=True)


def failed(exc: OrchestrationError, as_json: bool, *, owner: str | None = None) -> typer.Exit:
    """Report ``exc`` (JSON naming the field, and the saved run of a launch the broker did
    not take, with ``--json``); the exit to raise: :data:`EXIT_NOT_SENT` for that launch,
    :data:`EXIT_ERROR` for any other error. ``owner``: the owner who looked for something
    that is not there, named in the message with how to choose another."""
    message = str(exc)
    if owner is not None:
        if isinstance(exc, RunNotFound):
            message = f"no run {exc.run_id!r} for owner {owner!r}"
        else:
            message += f" for owner {owner!r}"
        message += "; give --owner NAME, or set ORCH_OWNER, to act as another owner"
    if as_json:
        body: dict[str, Any] = {"code": exc.code, "message": message}
        if isinstance(exc, ValidationError):
            body["field"] = exc.field
        if isinstance(exc, BrokerUnavailable):
            body.update(run_id=exc.run_id, broker=exc.broker, cause=exc.cause)
        sys.stderr.write(json.dumps({"error": body}) + "\n")
    else:
        error_line(message)
    return typer.Exit(EXIT_NOT_SENT if isinstance(exc, BrokerUnavailable) else EXIT_ERROR)


def ago(now: datetime, then: datetime) -> str:
    """``then`` from ``now`` in the largest whole unit: ``12s ago``, ``4m ago``, ``in 2h``."""
    seconds = (now - then).total_seconds()
    size = abs(seconds)
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if size >= length:
            amount = f"{size // length:.0f}{unit}"
            break
    else:
        amount = f"{size:.0f}s"
    return f"{amount} ago" if seconds >= 0 else f"in {amount}"


def orchestrator_and_owner(owner: str | None) -> tuple[Orchestrator, str]:
    """The Python API from the environment, and who acts: ``--owner`` or ``ORCH_OWNER``.
    Imported late, so that ``--help`` loads neither the database layer nor the settings."""
    from orchestration.core.settings import get_settings
    from orchestration.service import Orchestrator

    return Orchestrator.from_env(), owner or get_settings().owner
