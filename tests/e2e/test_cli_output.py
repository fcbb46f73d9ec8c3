"""What a newcomer reads from the CLI (issue 33, issue 30's CLI item), through the installed
``orchestration`` command in an 80-column terminal, against a real worker.

* What owners and providers write prints as written: a workflow named ``evil[/x]`` crashes
  nothing, and ``[link=...]`` never becomes a terminal hyperlink.
* ``runs`` never cuts an id; ``show`` keeps outputs on lines of their own.
* Each small guess gets one clear line: finished runs are not "cancelled", not-found names
  the owner, a bare string is not a workflow, ``tokens create`` asks for an owner, help text
  is clean, paused schedules have no next fire, the rerun journal names the step.
* ``events RUN`` prints the journal; read-only commands create no database.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from orchestration.runtime.processes import ManagedProcess
from tests.conftest import wait_for
from tests.e2e.test_cli import CLI, EXAMPLES
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

#: Rich markup an owner or a provider may write: a closing tag with nothing open (Rich raises
#: ``MarkupError``) and a hyperlink.
HOSTILE = "evil[/x] [link=https://example.com]click[/link]"
#: The start of a terminal hyperlink (OSC 8).
HYPERLINK = "\x1b]8;"


def run_cli(
    stack: Stack, *args: str, owner: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The command in an 80-column terminal; ``TTY_COMPATIBLE=1`` makes Rich write the
    escape codes it would write to a terminal (styles, hyperlinks)."""
    environment = {**stack.env, "ORCH_OWNER": owner, "COLUMNS": "80", "TTY_COMPATIBLE": "1"}
    environment.pop("NO_COLOR", None)
    return subprocess.run(
        [CLI, *args],
        env={**environment, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def plain(text: str) -> str:
    """``text`` without its colour and style codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def flat(text: str) -> str:
    """``text`` without styles, every run of white space one space (lines wrap at 80)."""
    return " ".join(plain(text).split())


def record(stack: Stack, run_id: str, owner: str) -> Any:
    return json.loads(ok(run_cli(stack, "show", run_id, "--json", owner=owner)))


def _workflow(tmp_path: Path, name: str, body: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def test_owner_and_provider_text_prints_as_written(
    stack: Stack, worker: ManagedProcess, tmp_path: Path, owner: str
) -> None:
    flow = _workflow(
        tmp_path,
        "evil",
        {
            "name": HOSTILE,
            "steps": [
                {
                    "id": "a",
                    "provider": "scripted",
                    "task": "go",
                    "poll_interval": 0.1,
                    "with": {
                        "states": [["running", 0.2], ["failed"]],
                        "error": f"[bold]boom[/] {HOSTILE}",
                    },
                }
            ],
        },
    )
    launched = run_cli(stack, "launch", str(flow), owner=owner)
    assert HOSTILE in flat(ok(launched))
    run_id = re.findall(r"[0-9a-f]{32}", launched.stdout)[0]
    wait_for(lambda: record(stack, run_id, owner)["status"] == "failed", 30, what="failure")
    for command in (["show", run_id], ["runs"], ["explain", run_id], ["events", run_id]):
        out = ok(run_cli(stack, *command, owner=owner))
        assert HYPERLINK not in out, command
        assert command[0] == "events" or "[link=" in out, (command, out)
    shown = flat(ok(run_cli(stack, "show", run_id, owner=owner)))
    assert f"[bold]boom[/] {HOSTILE}" in shown and f"workflow={HOSTILE}" in shown


def test_runs_never_cuts_an_id_at_80_columns(
    stack: Stack, worker: ManagedProcess, tmp_path: Path, owner: str
) -> None:
    long_name = _workflow(
        tmp_path,
        "long",
        {
            "name": "a-workflow-with-a-name-long-enough-to-need-two-lines-or-more",
            "steps": [{"id": "s", "provider": "scripted", "task": "t"}],
        },
    )
    ids = [
        json.loads(ok(run_cli(stack, "launch", str(path), "--json", owner=owner)))["id"]
        for path in (long_name, EXAMPLES / "endless.yaml")
    ]
    listed = plain(ok(run_cli(stack, "runs", owner=owner)))
    assert all(run_id in listed for run_id in ids), listed
    assert all(len(line) <= 80 for line in listed.splitlines()), listed
    for run_id in ids:
        run_cli(stack, "cancel", run_id, owner=owner)


def test_show_keeps_each_output_on_a_line_of_its_own_at_80_columns(
    stack: Stack, worker: ManagedProcess, owner: str
) -> None:
    done = json.loads(
        ok(
            run_cli(
                stack,
                "launch",
                str(EXAMPLES / "research.yaml"),
                "--args",
                '{"topic": "tides"}',
                "--wait",
                "--json",
                owner=owner,
            )
        )
    )
    shown = plain(ok(run_cli(stack, "show", done["id"], owner=owner)))
    lines = shown.splitlines()
    assert all(len(line) <= 80 for line in lines), shown
    assert '  summarize output: "Three facts, summarized."' in lines, shown
    facts = '  research output: {"facts": ["fact one", "fact two", "fact three"]}'
    assert facts in lines, shown


def test_cancelling_a_finished_run_says_nothing_was_cancelled(
    stack: Stack, worker: ManagedProcess, owner: str
) -> None:
    done = json.loads(
        ok(
            run_cli(
                stack,
                "launch",
                str(EXAMPLES / "research.yaml"),
                "--args",
                '{"topic": "kelp"}',
                "--wait",
                "--json",
                owner=owner,
            )
        )
    )
    said = ok(run_cli(stack, "cancel", done["id"], owner=owner))
    assert plain(said).strip() == f"run {done['id']} already completed; nothing to cancel"
    again = json.loads(ok(run_cli(stack, "cancel", done["id"], "--json", owner=owner)))
    assert (again["status"], again["changed"]) == ("completed", False)
    live = json.loads(
        ok(run_cli(stack, "launch", str(EXAMPLES / "endless.yaml"), "--json", owner=owner))
    )
    cancelled = json.loads(ok(run_cli(stack, "cancel", live["id"], "--json", owner=owner)))
    assert (cancelled["status"], cancelled["changed"]) == ("cancelled", True)


def test_not_found_names_the_owner_and_how_to_choose_another(stack: Stack, owner: str) -> None:
    for command in ("show", "explain", "events", "cancel"):
        missing = run_cli(stack, command, "0123456789abcdef", owner=owner)
        assert missing.returncode == 2
        (line,) = missing.stderr.splitlines()
        assert f"no run '0123456789abcdef' for owner '{owner}'" in line, line
        assert "--owner" in line and "ORCH_OWNER" in line, line
    named = run_cli(stack, "launch", "no-such-flow", owner=owner)
    assert named.returncode == 2
    assert f"for owner '{owner}'" in named.stderr and "--owner" in named.stderr


def test_a_file_holding_a_bare_string_is_not_a_workflow(
    stack: Stack, tmp_path: Path, owner: str
) -> None:
    bare = tmp_path / "bare.yaml"
    bare.write_text("just a string\n", encoding="utf-8")
    result = run_cli(stack, "launch", str(bare), owner=owner)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "holds a string, not a workflow" in line and "is not a name" not in line, line


def test_tokens_create_asks_for_an_owner_or_operator(stack: Stack, owner: str) -> None:
    result = run_cli(stack, "tokens", "create", owner=owner)
    assert result.returncode == 2 and result.stdout == ""
    assert "give --owner NAME" in result.stderr and "--operator" in result.stderr


def test_events_prints_the_journal(stack: Stack, worker: ManagedProcess, owner: str) -> None:
    done = json.loads(
        ok(
            run_cli(
                stack,
                "launch",
                str(EXAMPLES / "research.yaml"),
                "--args",
                '{"topic": "otters"}',
                "--wait",
                "--json",
                owner=owner,
            )
        )
    )
    journal = json.loads(ok(run_cli(stack, "events", done["id"], "--json", owner=owner)))
    assert journal[0]["to"] == "queued" and journal[0]["cause"] == "launched"
    assert {"step_id", "from", "to", "cause", "stop_reason", "at"} == set(journal[0])
    assert journal[-1]["to"] == "completed"
    printed = plain(ok(run_cli(stack, "events", done["id"], owner=owner))).splitlines()
    assert sum(bool(re.match(r"\d{4}-\d\d-\d\dT", line)) for line in printed) == len(journal)
    assert "run: - -> queued  launched" in printed[0]
    assert any("step summarize: running -> completed" in line for line in printed)


def test_help_text_is_clean() -> None:
    from orchestration.surfaces.cli import app

    root: Any = typer.main.get_command(app)
    paths = [[]]
    for name, command in root.commands.items():
        paths.append([name])
        paths += [[name, sub] for sub in getattr(command, "commands", {})]
    runner = CliRunner()
    for path in paths:
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, color=False)
        assert shown.exit_code == 0, (path, shown.output)
        assert "``" not in shown.output and "<bool>" not in shown.output, (path, shown.output)
        assert all(len(line) <= 80 for line in shown.output.splitlines()), shown.output
        lines = shown.output.splitlines()
        cut = [line for line in lines if line.endswith("...") and "Usage:" not in line]
        assert not cut, f"a command's summary is cut: {cut}"
    launch = runner.invoke(app, ["launch", "--help"], env={"COLUMNS": "80"}).output
    assert "NAME[@VERSION]" in launch, launch


def test_a_paused_schedule_shows_no_next_fire(stack: Stack, tmp_path: Path, owner: str) -> None:
    flow = _workflow(
        tmp_path,
        "nightly",
        {
            "name": "nightly",
            "schedule": {"cron": "0 3 * * *"},
            "steps": [{"id": "s", "provider": "scripted", "task": "t"}],
        },
    )
    ok(run_cli(stack, "workflows", "register", str(flow), owner=owner))
    (active,) = json.loads(ok(run_cli(stack, "schedules", "list", "--json", owner=owner)))
    assert len(active["next_fires"]) == 3
    ok(run_cli(stack, "schedules", "pause", "nightly", owner=owner))
    (paused,) = json.loads(ok(run_cli(stack, "schedules", "list", "--json", owner=owner)))
    assert (paused["paused"], paused["next_fires"]) == (True, [])
    table = plain(ok(run_cli(stack, "schedules", "list", owner=owner)))
    assert "paused" in table and active["next_fires"][0] not in table, table


def test_the_rerun_journal_names_the_step(
    stack: Stack, worker: ManagedProcess, tmp_path: Path, owner: str
) -> None:
    flow = _workflow(
        tmp_path,
        "two",
        {
            "name": "two",
            "steps": [
                {
                    "id": "first",
                    "provider": "scripted",
                    "task": "a",
                    "poll_interval": 0.1,
                    "with": {"states": [["completed"]]},
                },
                {
                    "id": "second",
                    "provider": "scripted",
                    "task": "b",
                    "poll_interval": 0.1,
                    "with": {"states": [["failed"]]},
                },
            ],
        },
    )
    failed = json.loads(run_cli(stack, "launch", str(flow), "--wait", "--json", owner=owner).stdout)
    assert failed["status"] == "failed"
    again = json.loads(ok(run_cli(stack, "rerun", failed["id"], "--json", owner=owner)))
    journal = stack.orchestrator().events(again["id"], owner=owner)
    assert journal[0]["cause"] == f"rerun of {failed['id']} from step 'second'"


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["show", "x"],
        ["explain", "x"],
        ["events", "x"],
        ["workflows", "list"],
        ["schedules", "list"],
        ["tokens", "list"],
        ["health"],
    ],
)
def test_read_only_commands_create_no_database(
    stack: Stack, tmp_path: Path, command: list[str]
) -> None:
    env = {key: value for key, value in stack.env.items() if key != "ORCH_DATABASE_URL"}
    default = subprocess.run(
        [CLI, *command],
        env={**env, "COLUMNS": "80"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert default.returncode == (1 if command == ["health"] else 2), default.stderr
    assert list(tmp_path.iterdir()) == [], "a read-only command created a file"
    said = default.stdout + default.stderr
    assert "no database at sqlite:///orchestration.db" in said and "db upgrade" in said
    wrong = tmp_path / "missing" / "folder" / "db.sqlite"
    elsewhere = subprocess.run(
        [CLI, *command],
        env={**env, "ORCH_DATABASE_URL": f"sqlite:///{wrong}"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert elsewhere.returncode != 0 and not (tmp_path / "missing").exists()
    assert os.listdir(tmp_path) == []
