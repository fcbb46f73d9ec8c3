"""``orchestration owners``: an operator's own values of an owner's budgets, and its use.

``owners set NAME --max-active-runs 50`` stores the owner's own value (``default`` puts the
setting's back); ``owners show NAME`` prints each budget's use against its limit; ``owners
list`` the owners with own values. The values take effect at the owner's next launch or
registration: admission reads them in its own statement
(:mod:`orchestration.limits.owner_budgets`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from orchestration.core.errors import OrchestrationError, ValidationError
from orchestration.surfaces.cli_common import AsJson, console, dump, failed

if TYPE_CHECKING:
    from orchestration.runtime.executor import Executor

owners_app = typer.Typer(
    help="Owners: budgets and use, suspend and resume.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
_out = console()

_HELP = "A whole number from 1, or 'default' for the setting's ({})."
Name = Annotated[str, typer.Argument(metavar="NAME", help="The owner.")]
ActiveRuns = Annotated[
    str | None,
    typer.Option(help=_HELP.format("ORCH_MAX_ACTIVE_RUNS_PER_OWNER"), show_default=False),
]
LiveTurns = Annotated[
    str | None,
    typer.Option(help=_HELP.format("ORCH_MAX_LIVE_TURNS_PER_OWNER"), show_default=False),
]
Definitions = Annotated[
    str | None,
    typer.Option(help=_HELP.format("ORCH_MAX_DEFINITIONS_PER_OWNER"), show_default=False),
]
StoredBytes = Annotated[
    str | None,
    typer.Option(help=_HELP.format("ORCH_MAX_STORED_BYTES_PER_OWNER"), show_default=False),
]


def _value(column: str, text: str) -> int | None:
    """``default`` (``None``) or a whole number; :class:`ValidationError` naming the option."""
    if text.strip().lower() == "default":
        return None
    try:
        return int(text)
    except ValueError:
        option = "--" + column.replace("_", "-")
        raise ValidationError(option, f"{text!r} is not a whole number or default") from None


def _executor() -> Executor:
    from orchestration.core.db import check_ready
    from orchestration.core.settings import get_settings
    from orchestration.runtime.executor import Executor
    from orchestration.runtime.readiness import require_database

    settings = get_settings()
    require_database(settings.database_url)
    check_ready(settings.database_url)
    return Executor(settings, None)


@owners_app.command("set")
def set_(
    name: Name,
    max_active_runs: ActiveRuns = None,
    max_live_turns: LiveTurns = None,
    max_definitions: Definitions = None,
    max_stored_bytes: StoredBytes = None,
    as_json: AsJson = False,
) -> None:
    """Set the owner's own budgets.

    The options not given keep their value; 'default' puts the setting's back."""
    from orchestration.core.db import utcnow
    from orchestration.core.followups import Done
    from orchestration.limits import owner_budgets
    from orchestration.runs.launching import check_name

    given = {
        "max_active_runs": max_active_runs,
        "max_live_turns": max_live_turns,
        "max_definitions": max_definitions,
        "max_stored_bytes": max_stored_bytes,
    }
    try:
        check_name("owner", name)
        values = {column: _value(column, text) for column, text in given.items() if text}
        if not values:
            raise ValidationError("options", "give at least one budget, such as --max-active-runs")
        now = utcnow()
        stored = _executor()(
            lambda session: Done(owner_budgets.set_own(session, name, values, now))
        )
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({"owner": name, **stored})
    else:
        shown = ", ".join(f"{k}={'default' if v is None else v}" for k, v in stored.items())
        _out.print(f"owner {name}: {shown}", soft_wrap=True)


@owners_app.command("show")
def show(name: Name, as_json: AsJson = False) -> None:
    """Each budget of the owner: its use against its limit.

    The limit is the owner's own value where one is set, else the setting's."""
    from orchestration.core.followups import Done
    from orchestration.limits import owner_budgets
    from orchestration.runs.launching import check_name

    try:
        check_name("owner", name)
        executor = _executor()
        uses = executor(lambda session: Done(owner_budgets.use(session, executor.settings, name)))
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({"owner": name, "budgets": [one.as_dict() for one in uses]})
        return
    table = Table("budget", "used", "limit", "from", title=f"owner {name}")
    for one in uses:
        source = f"own ({one.option})" if one.own is not None else one.setting
        table.add_row(one.budget, str(one.used), str(one.limit), source)
    _out.print(table)


@owners_app.command("list")
def list_(as_json: AsJson = False) -> None:
    """The owners with their own budgets.

    A blank value is the setting's."""
    from orchestration.core.followups import Done
    from orchestration.limits import owner_budgets

    try:
        rows: list[dict[str, Any]] = _executor()(
            lambda session: Done(owner_budgets.listed(session))
        )
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump(rows)
        return
    table = Table("owner", *owner_budgets.COLUMNS)
    for row in rows:
        table.add_row(
            row["owner"],
            *("" if row[c] is None else str(row[c]) for c in owner_budgets.COLUMNS),
        )
    _out.print(table)
