"""How a run record looks in a terminal: shared by the CLI and the demo."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestration.records import RunRecord

_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
    "timed_out": "red",
    "interrupted": "magenta",
    "running": "cyan",
    "waiting": "cyan",
    "parked": "blue",
    "retrying": "yellow",
    "cancelling": "yellow",
    "queued": "white",
}


def styled(status: str) -> str:
    """``status`` in its colour (rich markup)."""
    return f"[{_STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _short(value: object, artifact: dict[str, object] | None = None) -> str:
    if artifact is not None:
        return f"artifact {artifact['size']} B sha256:{str(artifact['sha256'])[:12]}"
    return json.dumps(value, ensure_ascii=False)[:60] if value is not None else "-"


def show(console: Console, record: RunRecord) -> None:
    """The run, its stop, its result and deadline, and a table of its steps."""
    console.print(
        f"run [bold]{record.id}[/]  {styled(record.status)}  health={record.health}  "
        f"workflow={record.workflow_name}"
    )
    if record.stop_reason:
        console.print(f"  stop_reason: {record.stop_reason}")
    if record.error:
        console.print(f"  error: [red]{record.error}[/]")
    if record.result is not None:
        console.print(f"  result: {json.dumps(record.result, ensure_ascii=False)[:500]}")
    deadline = record.deadline_at.isoformat(timespec="seconds") if record.deadline_at else "-"
    console.print(f"  deadline_at: {deadline}")
    if record.parent_run_id is not None:
        console.print(
            f"  branch {record.branch_key} of run {record.parent_run_id} "
            f"(step {record.parent_step})"
        )
    table = Table("step", "provider", "status", "attempt", "polls", "provider says", "output")
    for step in record.steps:
        table.add_row(
            step.step_id,
            step.provider,
            styled(step.status),
            str(step.attempt),
            str(step.polls),
            step.last_provider_status or "-",
            _short(step.output, step.output_artifact),
        )
        for branch in step.branches or []:
            table.add_row(
                escape(f"  [{branch['id']}]"),
                f"run {branch['run_id'][:12]}",
                styled(branch["status"]),
                str(branch["attempt"]),
                "",
                "",
                _short(branch["output"], branch.get("output_artifact")),
            )
    console.print(table)
    for step in record.steps:
        for ended in step.past_attempts:
            console.print(
                f"  {step.step_id} attempt {ended.get('attempt')} ended "
                f"({ended.get('reason')}): {str(ended.get('error'))[:200]}",
                markup=False,
            )
        if step.status == "retrying" and step.retry_at is not None:
            console.print(
                f"  {step.step_id} attempt {step.attempt} starts at "
                f"{step.retry_at.isoformat(timespec='seconds')}"
            )
