"""How a run record looks in a terminal: shared by the CLI and the demo.

Everything an owner or a provider wrote (the workflow's name, errors, outputs, what the
provider says) is put in :class:`~rich.text.Text` as plain text, so that it prints as written
on any console: no ``[...]`` in it is ever read as Rich markup.

The steps' table holds only short columns, and each output gets a line of its own below it,
so the record reads well in an 80-column terminal.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestration.reads.records import RunRecord, StepRecord

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
#: Longest output shown per step, and the longest past attempt error (characters).
OUTPUT_CHARS = 300
ERROR_CHARS = 200


def styled(status: str) -> Text:
    """``status`` in its colour."""
    return Text(status, style=_STATUS_STYLE.get(status, "white"))


def _short(value: object, artifact: dict[str, Any] | None = None) -> str:
    if artifact is not None:
        return f"artifact {artifact['size']} B sha256:{str(artifact['sha256'])[:12]}"
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= OUTPUT_CHARS else text[: OUTPUT_CHARS - 1] + "…"


def _line(*parts: str | tuple[str, str] | Text) -> Text:
    return Text.assemble(*parts)


def show(console: Console, record: RunRecord) -> None:
    """The run, its stop, its result and deadline, a table of its steps, then each step's
    output, branches and past attempts."""
    console.print(
        _line(
            "run ",
            (record.id, "bold"),
            "  ",
            styled(record.status),
            f"  health={record.health}  workflow=",
            record.workflow_name,
        )
    )
    if record.stop_reason:
        console.print(_line("  stop_reason: ", record.stop_reason))
    if record.error:
        console.print(_line("  error: ", (record.error, "red")))
    if record.result is not None:
        console.print(_line("  result: ", _short(record.result)))
    deadline = record.deadline_at.isoformat(timespec="seconds") if record.deadline_at else "-"
    console.print(_line("  deadline_at: ", deadline))
    if record.parent_run_id is not None:
        console.print(
            _line(
                f"  branch {record.branch_key} of run {record.parent_run_id} ",
                f"(step {record.parent_step})",
            )
        )
    table = Table("step", "provider", "status", "attempt", "polls", "provider says")
    for step in record.steps:
        table.add_row(
            Text(step.step_id),
            Text(step.provider),
            styled(step.status),
            str(step.attempt),
            str(step.polls),
            Text(step.last_provider_status or "-"),
        )
    console.print(table)
    for step in record.steps:
        _below(console, step)


def _below(console: Console, step: StepRecord) -> None:
    """A step's lines under the table: its output, its branches, its past attempts and its
    next attempt."""
    if step.output is not None or step.output_artifact is not None:
        console.print(
            _line(f"  {step.step_id} output: ", _short(step.output, step.output_artifact))
        )
    for branch in step.branches or []:
        console.print(
            _line(
                f"  {step.step_id} [",
                str(branch["id"]),
                f"] run {branch['run_id'][:12]} ",
                styled(branch["status"]),
                f" (attempt {branch['attempt']}), output: ",
                _short(branch["output"], branch.get("output_artifact")),
            )
        )
    for ended in step.past_attempts:
        console.print(
            _line(
                f"  {step.step_id} attempt {ended.get('attempt')} ended (",
                str(ended.get("reason")),
                "): ",
                str(ended.get("error"))[:ERROR_CHARS],
            )
        )
    if step.status == "retrying" and step.retry_at is not None:
        console.print(
            f"  {step.step_id} attempt {step.attempt} starts at "
            f"{step.retry_at.isoformat(timespec='seconds')}",
            markup=False,
        )
