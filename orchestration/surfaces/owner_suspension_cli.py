"""CLI commands that stop and restart one owner: ``orchestration owners suspend|resume|suspended``.

An operator's commands: they act on the database directly (the CLI holds its URL), not as
an owner. Registered on the ``owners`` group by :func:`register`.
"""

from __future__ import annotations

import getpass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError
from orchestration.surfaces.cli_common import AsJson, console, dump, failed

if TYPE_CHECKING:
    from orchestration.runs.owner_cancels import Suspended

_out = console()

OwnerName = Annotated[str, typer.Argument(metavar="OWNER", help="The owner to act on.")]
By = Annotated[
    str | None,
    typer.Option("--by", help="Who acts, as the audit shows it (default: the login name)."),
]


def _orchestrator() -> Any:
    """The Python API, sending through the configured broker (a cancel revokes tasks);
    imported late so that ``--help`` loads nothing of it."""
    from orchestration.service import Orchestrator

    return Orchestrator.from_env()


def _who(by: str | None) -> str:
    return by or f"operator {getpass.getuser()}"


def suspend(
    owner: OwnerName,
    reason: Annotated[
        str, typer.Option("--reason", help="Why, as the owner's refusals will say.")
    ] = "suspended by an operator",
    cancel_live: Annotated[
        bool, typer.Option("--cancel-live", help="Also cancel every live run of the owner.")
    ] = False,
    batch: Annotated[int, typer.Option(min=1, help="Runs read per batch by --cancel-live.")] = 100,
    by: By = None,
    as_json: AsJson = False,
) -> None:
    """Suspend an owner: nothing new of it is admitted.

    Its launches, schedule fires, registrations and tokens are refused; its live runs go on
    unless --cancel-live is given."""
    try:
        done = _orchestrator().suspend_owner(
            owner,
            reason=reason,
            by=_who(by),
            cancel_live=cancel_live,
            batch=batch,
            progress=None if as_json else _progress,
        )
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({**done.suspension.as_dict(), "new": done.new, "cancelled": done.cancelled})
    elif done.cancelled is not None:
        _out.print(f"cancelled {done.cancelled} live runs of {owner}")


def _progress(so_far: Suspended) -> None:
    """Once the suspension committed, what it is; then the count after each batch."""
    if so_far.cancelled is not None:
        _out.print(f"... {so_far.cancelled} runs cancelled so far")
        return
    found = so_far.suspension
    state = "suspended" if so_far.new else "already suspended"
    since = found.since.isoformat(timespec="seconds")
    _out.print(Text(f"{state} owner {found.owner} since {since}: ") + Text(found.reason))


def resume(owner: OwnerName, by: By = None, as_json: AsJson = False) -> None:
    """Resume a suspended owner.

    Its launches, schedules and tokens work again. Fires missed while it was suspended stay
    recorded as refused."""
    try:
        lifted = _orchestrator().resume_owner(owner, by=_who(by))
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({"owner": owner, "resumed": lifted is not None})
    elif lifted is None:
        _out.print(Text(f"owner {owner} was not suspended"))
    else:
        since = lifted.since.isoformat(timespec="seconds")
        _out.print(Text(f"resumed owner {owner} (suspended since {since})"))


def listing(as_json: AsJson = False) -> None:
    """List the suspended owners: since when, why and by whom."""
    try:
        found = _orchestrator().suspended_owners()
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump([one.as_dict() for one in found])
        return
    if not found:
        _out.print("no owner is suspended")
        return
    table = Table("owner", "since", "by", "reason")
    for one in found:
        table.add_row(
            Text(one.owner),
            one.since.isoformat(timespec="seconds"),
            Text(one.by),
            Text(one.reason),
        )
    _out.print(table)


def register(app: typer.Typer) -> None:
    """Add the commands to the ``owners`` group ``app``."""
    app.command("suspend")(suspend)
    app.command("resume")(resume)
    app.command("suspended")(listing)
