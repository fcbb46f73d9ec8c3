"""CLI commands that stop and restart one owner: ``orchestration owners suspend|resume|suspended``.

An operator's commands: they act on the database directly (the CLI holds its URL), not as
an owner. Registered on the ``owners`` group by :func:`register`.
"""

from __future__ import annotations

import getpass
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError
from orchestration.surfaces.cli_common import AsJson, console, dump, failed

_out = console()

OwnerName = Annotated[str, typer.Argument(metavar="OWNER", help="The owner to act on.")]
By = Annotated[
    str | None,
    typer.Option("--by", help="Who acts, as the audit shows it (default: the login name)."),
]


def _setup() -> tuple[Any, Any]:
    """The settings and an executor that sends (a cancel revokes tasks); imported late so
    that ``--help`` loads neither."""
    from orchestration.core.db import check_ready
    from orchestration.core.settings import get_settings
    from orchestration.runtime.celery_queue import client_executor
    from orchestration.runtime.readiness import require_database

    settings = get_settings()
    require_database(settings.database_url)
    check_ready(settings.database_url)
    return settings, client_executor(settings)


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
    from orchestration.core.db import utcnow
    from orchestration.core.followups import Done
    from orchestration.limits import suspensions
    from orchestration.runs import owner_cancels

    try:
        settings, transact = _setup()
        found, new = transact(
            lambda session: Done(
                suspensions.suspend(session, owner, utcnow(), reason=reason, by=_who(by))
            )
        )
        if not as_json:
            state = "suspended" if new else "already suspended"
            _out.print(
                Text(f"{state} owner {owner} since {found.since.isoformat(timespec='seconds')}: ")
                + Text(found.reason)
            )
        cancelled = None
        if cancel_live:
            cancelled = owner_cancels.cancel_live(
                transact,
                settings,
                found,
                clock=utcnow,
                batch=batch,
                progress=None if as_json else _progress,
            )
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump({**found.as_dict(), "new": new, "cancelled": cancelled})
    elif cancelled is not None:
        _out.print(f"cancelled {cancelled} live runs of {owner}")


def _progress(count: int) -> None:
    _out.print(f"... {count} runs cancelled so far")


def resume(owner: OwnerName, by: By = None, as_json: AsJson = False) -> None:
    """Resume a suspended owner.

    Its launches, schedules and tokens work again. Fires missed while it was suspended stay
    recorded as refused."""
    from orchestration.core.db import utcnow
    from orchestration.core.followups import Done
    from orchestration.limits import suspensions

    try:
        _, transact = _setup()
        lifted = transact(
            lambda session: Done(suspensions.resume(session, owner, utcnow(), by=_who(by)))
        )
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
    from orchestration.core.followups import Done
    from orchestration.limits import suspensions

    try:
        _, transact = _setup()
        found = transact(lambda session: Done(list(suspensions.current(session).values())))
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
