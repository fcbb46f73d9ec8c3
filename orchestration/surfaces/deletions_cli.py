"""CLI commands for deleting runs: ``orchestration delete RUN`` (the run's owner) and
``orchestration deletions`` (the audit of what owners deleted, for an operator).

A live run, a branch run or a run still cleaning up is refused with one line saying why and
what to do, exit status 2 (:mod:`orchestration.runs.deletion`).
"""

from __future__ import annotations

import getpass
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from orchestration.core.errors import OrchestrationError
from orchestration.core.followups import Done
from orchestration.surfaces.cli_common import (
    AsJson,
    Owner,
    RunId,
    console,
    dump,
    failed,
    orchestrator_and_owner,
)

_out = console()


def delete(run_id: RunId, owner: Owner = None, as_json: AsJson = False) -> None:
    """Delete one of your ended runs with its branch runs and journal.

    Artifacts nothing else references go too; operators see the deletion in `deletions`."""
    from orchestration.upkeep import retention

    who = owner
    try:
        orch, who = orchestrator_and_owner(owner)
        done = retention.delete_run(
            orch.transact,
            orch.settings,
            run_id,
            owner=who,
            by=f"cli ({getpass.getuser()})",
            now=orch.clock(),
        )
    except OrchestrationError as exc:
        raise failed(exc, as_json, owner=who) from None
    counts = done.deleted.counts
    if as_json:
        dump(
            {
                "run_id": done.run_id,
                "owner": done.owner,
                "workflow": done.workflow,
                "status": done.status,
                "deleted_at": done.deleted_at,
                "by": done.by,
                "branch_runs": counts["branch_runs"],
                "rows": counts,
                "artifacts": done.artifacts,
            }
        )
        return
    _out.print(
        Text(
            f"deleted run {done.run_id} ({done.workflow}, {done.status}): "
            f"{counts['branch_runs']} branch runs, {counts['steps']} steps, "
            f"{counts['run_events']} events, {done.artifacts} artifacts"
        ),
        soft_wrap=True,
    )


def deletions(
    owner: Annotated[
        str | None, typer.Option("--owner", help="Only this owner's deletions.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 50,
    as_json: AsJson = False,
) -> None:
    """List the runs owners deleted, newest first.

    An operator's audit: what each run was, when and through what it was deleted."""
    from orchestration.runs import deletion

    try:
        orch, _ = orchestrator_and_owner(None)
        rows = orch.transact(
            lambda session: Done(deletion.listing(session, owner=owner, limit=limit))
        )
    except OrchestrationError as exc:
        raise failed(exc, as_json) from None
    if as_json:
        dump(rows)
        return
    table = Table("deleted", "run", "owner", "workflow", "status", "by")
    for row in rows:
        table.add_row(
            row["deleted_at"].isoformat(timespec="seconds"),
            row["run_id"],
            Text(row["owner"]),
            Text(row["workflow"]),
            row["status"],
            Text(row["by"]),
        )
    _out.print(table)


def register(app: typer.Typer) -> None:
    """Add ``delete`` and ``deletions`` to the main CLI."""
    app.command("delete")(delete)
    app.command("deletions")(deletions)
