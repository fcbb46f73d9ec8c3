"""The ``orchestration`` command line.

Every command that acts on runs takes ``--owner`` (default ``ORCH_OWNER``). ``--json`` prints
records for programs; errors go to stderr as one line with exit status 2 and no traceback (3
for a launch whose run is saved but not sent: the broker did not answer). Every command reads
and checks the settings first, so a bad ``ORCH_`` variable is reported before anything
starts. Output is laid out for an 80-column terminal, and nothing printed is read as Rich
markup (``cli_common``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table
from rich.text import Text
from sqlalchemy.exc import SQLAlchemyError
from typer._click import Context as ClickContext  # typer vendors click; its groups take this
from typer.core import TyperGroup

from orchestration.core.errors import (
    ConfigurationError,
    OrchestrationError,
    RunNotFound,
    ValidationError,
)
from orchestration.core.settings import get_settings
from orchestration.core.states import RUN_TERMINAL, RunStatus
from orchestration.observability import logs, tracing
from orchestration.reads.records import RunRecord
from orchestration.surfaces import display
from orchestration.surfaces.cli_common import (
    AsJson,
    Owner,
    RunId,
    ago,
    console,
    dump,
    err,
    error_line,
    failed,
    json_arg,
)


class _SettingsFirst(TyperGroup):
    """The command group that reads and checks the settings before any command runs: a bad
    ``ORCH_`` variable is one line before a worker, beat or the demo starts (and before
    ``tasks`` is imported, which reads them at import). Here, unlike in a callback, the
    command's own arguments are still visible, so ``--json`` gets a JSON error."""

    def invoke(self, ctx: ClickContext) -> Any:
        if not ctx.resilient_parsing and "--help" not in ctx.args:
            try:
                settings = get_settings()
                logs.configure(settings.log_format)
                tracing.setup(settings, "orchestration")
            except ConfigurationError as exc:
                _fail(exc, "--json" in ctx.args)
        return super().invoke(ctx)


app = typer.Typer(
    cls=_SettingsFirst,
    help="Run AI-agent workflows on Celery; every run ends.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(db_app, name="db")

out = console()


def _owner(owner: str | None) -> str:
    return owner or get_settings().owner


def _orchestrator() -> Any:
    from orchestration.service import Orchestrator

    return Orchestrator.from_env()


def _record_json(record: RunRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


def _show(record: RunRecord) -> None:
    display.show(out, record)


def _fail(exc: OrchestrationError, as_json: bool, owner: str | None = None) -> NoReturn:
    """Report ``exc``; a run that is not found names ``owner``, who looked for it."""
    raise failed(exc, as_json, owner=_owner(owner) if isinstance(exc, RunNotFound) else None)


def _database_error(exc: SQLAlchemyError) -> str:
    """The driver's own first line (e.g. "connection refused"), not SQLAlchemy's SQL echo."""
    from orchestration.runtime.readiness import first_line

    return f"database: {first_line(exc)}"


@app.command()
def launch(
    file: Annotated[
        str, typer.Argument(help="Workflow file (YAML or JSON), or a registered NAME[@VERSION].")
    ],
    args: Annotated[str | None, typer.Option("--args", help="Args as a JSON object.")] = None,
    request_id: Annotated[str | None, typer.Option("--request-id")] = None,
    concurrency_key: Annotated[str | None, typer.Option("--concurrency-key")] = None,
    on_conflict: Annotated[str, typer.Option("--on-conflict")] = "reject",
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the run ends.")] = False,
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """Launch a workflow run (idempotent per --request-id)."""
    from orchestration.workflows import load_file
    from orchestration.workflows.registry import REFERENCE

    named = not Path(file).exists() and REFERENCE.fullmatch(file)
    try:
        definition = file if named else load_file(file)
        record = _orchestrator().launch(
            definition,
            json_arg(args, "args"),
            owner=_owner(owner),
            request_id=request_id,
            concurrency_key=concurrency_key,
            on_conflict=on_conflict,
        )
        if wait:
            record = _wait(record, _owner(owner), quiet=as_json)
    except ValidationError as exc:
        # A registered name that is not there: say whose registry was looked in.
        looked_up = named and exc.field == "workflow"
        raise failed(exc, as_json, owner=_owner(owner) if looked_up else None) from None
    except OrchestrationError as exc:
        _fail(exc, as_json, owner)
    if as_json:
        dump(_record_json(record))
    else:
        _show(record)
    if wait and record.status != RunStatus.COMPLETED:
        raise typer.Exit(1)


def _wait(record: RunRecord, owner: str, *, quiet: bool) -> RunRecord:
    orch = _orchestrator()
    with err.status(Text(f"run {record.id}: {record.status}"), spinner="dots") as status:
        while RunStatus(record.status) not in RUN_TERMINAL:
            time.sleep(0.25)
            record = orch.get(record.id, owner=owner)
            if not quiet:
                step = record.steps[min(record.current_step, len(record.steps) - 1)]
                status.update(
                    Text(
                        f"run {record.id}: {record.status} — step {step.step_id} {step.status} "
                        f"({step.last_provider_status or '…'}, {step.polls} polls)"
                    )
                )
    return record


def _print_record(call: Callable[[], RunRecord], as_json: bool, owner: str | None) -> None:
    """Run ``call`` and print the record it returns, or its error, as every command does."""
    try:
        record = call()
    except OrchestrationError as exc:
        _fail(exc, as_json, owner)
    if as_json:
        dump(_record_json(record))
    else:
        _show(record)


@app.command()
def show(run_id: RunId, owner: Owner = None, as_json: AsJson = False) -> None:
    """Show one run with its steps."""
    _print_record(lambda: _orchestrator().get(run_id, owner=_owner(owner)), as_json, owner)


@app.command()
def runs(
    status: Annotated[str | None, typer.Option("--status")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 50,
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """List runs, newest first."""
    try:
        records = _orchestrator().list(owner=_owner(owner), status=status, limit=limit)
    except OrchestrationError as exc:
        _fail(exc, as_json)
    if as_json:
        dump([_record_json(record) for record in records])
        return
    # The id is never cut: it is what `show` and `cancel` take. The workflow's name gives way.
    table = Table(box=None, pad_edge=False, collapse_padding=True)
    table.add_column("run", no_wrap=True, min_width=32)
    table.add_column("workflow", overflow="fold")
    for name in ("status", "health", "created", "deadline"):
        table.add_column(name, no_wrap=True)
    now = datetime.now(UTC)
    for record in records:
        deadline = record.deadline_at
        table.add_row(
            record.id,
            Text(record.workflow_name),
            display.styled(record.status),
            record.health,
            ago(now, record.created_at),
            ago(now, deadline) if deadline and record.health != "ended" else "-",
        )
    out.print(table)


@app.command()
def cancel(
    run_id: RunId,
    graceful: Annotated[
        bool, typer.Option("--graceful", help="Only flag it; the step stops at its next poll.")
    ] = False,
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """Cancel a run; returns once it is terminal (unless --graceful).

    A run that had already ended is left as it is: "already completed; nothing to cancel"
    (with --json, "changed": false), exit status 0."""
    try:
        done = _orchestrator().cancel_run(run_id, owner=_owner(owner), graceful=graceful)
    except OrchestrationError as exc:
        _fail(exc, as_json, owner)
    if as_json:
        dump({**_record_json(done.record), "changed": done.changed})
        return
    if not done.changed:
        out.print(f"run {run_id} already {done.record.status}; nothing to cancel")
        return
    _show(done.record)


@app.command()
def rerun(
    run_id: RunId,
    from_step: Annotated[
        str | None, typer.Option("--from", help="Rerun from this step (default: the failed one).")
    ] = None,
    request_id: Annotated[str | None, typer.Option("--request-id")] = None,
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """Run an ended run again from its failed (or a given) step.

    The new run reuses the outputs of the steps before that one."""
    _print_record(
        lambda: _orchestrator().rerun(
            run_id, owner=_owner(owner), from_step=from_step, request_id=request_id
        ),
        as_json,
        owner,
    )


@app.command()
def answer(
    run_id: RunId,
    step: Annotated[str, typer.Option("--step", help="The parked step's id.")],
    value: Annotated[str, typer.Option("--value", help="The answer, as JSON.")],
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """Answer a run parked for a human; it resumes."""
    _print_record(
        lambda: _orchestrator().answer(run_id, step, json_arg(value, "value"), owner=_owner(owner)),
        as_json,
        owner,
    )


@app.command()
def approve(
    run_id: RunId,
    step: Annotated[str, typer.Option("--step", help="The approval step's id.")],
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approve.")] = False,
    comment: Annotated[
        str | None, typer.Option("--comment", help="Why, recorded with the decision.")
    ] = None,
    owner: Owner = None,
    as_json: AsJson = False,
) -> None:
    """Approve (or --reject) a run's approval step.

    Approved, the run moves on; rejected, it fails."""
    _print_record(
        lambda: _orchestrator().approve(
            run_id, step, owner=_owner(owner), approve=not reject, comment=comment
        ),
        as_json,
        owner,
    )


@app.command()
def explain(run_id: RunId, owner: Owner = None, as_json: AsJson = False) -> None:
    """Say why a run is where it is and what moves it next.

    Also its deadline, and what is not running that should be (beat, a worker)."""
    try:
        summary = _orchestrator().explain(run_id, owner=_owner(owner))
    except OrchestrationError as exc:
        _fail(exc, as_json, owner)
    if as_json:
        dump(summary)
    else:
        out.print(summary["text"])


@app.command()
def events(run_id: RunId, owner: Owner = None, as_json: AsJson = False) -> None:
    """Print a run's journal (every status change), oldest first."""
    try:
        journal = _orchestrator().events(run_id, owner=_owner(owner))
    except OrchestrationError as exc:
        _fail(exc, as_json, owner)
    if as_json:
        dump(journal)
        return
    for event in journal:
        where = f"step {event['step_id']}" if event["step_id"] else "run"
        stop = f" ({event['stop_reason']})" if event["stop_reason"] else ""
        out.print(
            Text.assemble(
                event["at"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                f"  {where}: {event['from'] or '-'} -> ",
                display.styled(event["to"]),
                f"{stop}  ",
                event["cause"] or "",
            )
        )


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Create or migrate the schema (Alembic)."""
    from orchestration.core.db import upgrade

    try:
        upgrade(get_settings().database_url, revision)
    except OrchestrationError as exc:
        _fail(exc, False)
    except SQLAlchemyError as exc:
        error_line(_database_error(exc))
        raise typer.Exit(2) from None
    out.print(f"database at revision {revision}")


def _register_extensions() -> None:
    from orchestration.surfaces import (
        agents_cli,
        definitions_cli,
        deletions_cli,
        maintenance,
        owner_suspension_cli,
        owners_cli,
        process_cli,
        schedules_cli,
    )
    from orchestration.surfaces.api import commands

    owner_suspension_cli.register(owners_cli.owners_app)

    process_cli.register(app)
    commands.register(app)
    maintenance.register(app)
    definitions_cli.register_commands(app)
    schedules_cli.register_commands(app)
    deletions_cli.register(app)
    agents_cli.register_commands(app)
    app.add_typer(owners_cli.owners_app, name="owners")


_register_extensions()


def main() -> None:
    """Entry point: an error a command did not report itself (a configuration error, a
    database that cannot be reached) is still one line and exit status 2."""
    try:
        app()
    except OrchestrationError as exc:
        error_line(str(exc))
        sys.exit(2)
    except SQLAlchemyError as exc:
        error_line(_database_error(exc))
        sys.exit(2)
