"""The installed ``orchestration`` command, run as a user runs it, against a real worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestration.runtime.processes import ManagedProcess
from tests.conftest import wait_for
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

#: The sweeper counts as alive for 3 intervals after a pass: 30 s here, so that ``health`` run
#: right after ``sweep`` finds it alive however long each command takes to start on a busy
#: machine (with the shared 1 s interval, two CLI starts on a loaded host took longer).
STACK_SETTINGS = {"ORCH_SWEEP_INTERVAL": "10"}

EXAMPLES = Path(__file__).parents[2] / "orchestration" / "examples"
#: The console script installed beside this interpreter (the venv the tests run in).
CLI = str(Path(sys.executable).parent / "orchestration")


def cli(stack: Stack, *args: str, owner: str = "cli-user") -> subprocess.CompletedProcess[str]:
    env = {**stack.env, "ORCH_OWNER": owner}
    return subprocess.run(
        [CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_launch_wait_show_runs(stack: Stack, worker: ManagedProcess, tmp_path: Path) -> None:
    launched = as_json(
        cli(
            stack,
            "launch",
            str(EXAMPLES / "research.yaml"),
            "--args",
            '{"topic": "tides"}',
            "--request-id",
            "cli-1",
            "--wait",
            "--json",
        )
    )
    assert launched["status"] == "completed"
    assert launched["result"] == "Three facts, summarized."
    assert launched["steps"][0]["last_provider_status"] == "idle"
    assert set(launched) >= {"id", "owner", "request_id", "deadline_at", "task_ids", "health"}
    again = as_json(
        cli(
            stack,
            "launch",
            str(EXAMPLES / "research.yaml"),
            "--args",
            '{"topic": "tides"}',
            "--request-id",
            "cli-1",
            "--json",
        )
    )
    assert again["id"] == launched["id"]
    shown = as_json(cli(stack, "show", launched["id"], "--json"))
    assert shown["id"] == launched["id"] and len(shown["steps"]) == 2
    listed = as_json(cli(stack, "runs", "--status", "completed", "--json"))
    assert [run["id"] for run in listed] == [launched["id"]]
    human = cli(stack, "show", launched["id"])
    assert human.returncode == 0 and "completed" in human.stdout and "research" in human.stdout


def test_cancel_and_explain(stack: Stack, worker: ManagedProcess) -> None:
    run = as_json(cli(stack, "launch", str(EXAMPLES / "endless.yaml"), "--json", owner="c2"))
    wait_for(
        lambda: (
            as_json(cli(stack, "show", run["id"], "--json", owner="c2"))["steps"][0]["polls"] >= 2
        ),
        30,
    )
    explained = cli(stack, "explain", run["id"], owner="c2")
    assert explained.returncode == 0 and "polling its provider turn" in explained.stdout
    started = time.perf_counter()
    cancelled = as_json(cli(stack, "cancel", run["id"], "--json", owner="c2"))
    assert time.perf_counter() - started < 30
    assert (cancelled["status"], cancelled["stop_reason"]) == ("cancelled", "cancel_requested")
    ended = as_json(cli(stack, "explain", run["id"], "--json", owner="c2"))
    assert ended["health"] == "ended" and "terminal is final" in ended["next"]


def test_errors_go_to_stderr_without_traceback(stack: Stack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsteps:\n  - id: 'a b'\n    provider: scripted\n")
    result = cli(stack, "launch", str(bad))
    assert result.returncode == 2
    assert "steps[0].id" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    as_json_error = cli(stack, "launch", str(bad), "--json")
    body = json.loads(as_json_error.stderr)
    assert body["error"]["code"] == "validation_error" and body["error"]["field"] == "steps[0].id"
    missing = cli(stack, "show", "no-such-run")
    assert missing.returncode == 2 and "no run" in missing.stderr
    not_json = cli(stack, "launch", str(EXAMPLES / "research.yaml"), "--args", "{oops")
    assert not_json.returncode == 2 and "args" in not_json.stderr
    nofile = cli(stack, "launch", str(tmp_path / "nope.yaml"))
    assert nofile.returncode == 2 and "cannot read" in nofile.stderr


def test_another_owner_cannot_see_or_cancel(stack: Stack, worker: ManagedProcess) -> None:
    run = as_json(cli(stack, "launch", str(EXAMPLES / "endless.yaml"), "--json", owner="alice"))
    assert cli(stack, "show", run["id"], owner="mallory").returncode == 2
    assert cli(stack, "cancel", run["id"], owner="mallory").returncode == 2
    assert as_json(cli(stack, "runs", "--json", owner="mallory")) == []
    assert as_json(cli(stack, "cancel", run["id"], "--json", owner="alice"))["status"] == (
        "cancelled"
    )


def test_sweep_and_health(stack: Stack) -> None:
    report = as_json(cli(stack, "sweep", "--json"))
    assert {"live", "rearmed", "seconds"} <= set(report)
    health = cli(stack, "health", "--json")
    assert json.loads(health.stdout)["checks"]["sweeper"]["ok"] is True


# -- a newcomer's first hour (issue 15) -------------------------------------------------------


def _without_orch(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if not key.startswith("ORCH_")}


def test_db_upgrade_creates_the_folder_of_a_sqlite_file(stack: Stack, tmp_path: Path) -> None:
    database = tmp_path / "orchestration-docs" / "walkthrough.db"
    env = {**stack.env, "ORCH_DATABASE_URL": f"sqlite:///{database}"}
    result = subprocess.run(
        [CLI, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "database at revision head" in result.stdout and database.is_file()


def test_beat_creates_the_folder_of_its_schedule_file(stack: Stack, tmp_path: Path) -> None:
    schedule = tmp_path / "orchestration-docs" / "beat-schedule"
    beat = ManagedProcess([CLI, "beat", "-s", str(schedule)], stack.env, tmp_path / "beat.log")
    try:
        beat.wait_for_log("beat: Starting", timeout=30)
        wait_for(lambda: any(schedule.parent.glob("beat-schedule*")), 15, what="schedule file")
        assert beat.proc.poll() is None, beat.log()
    finally:
        beat.stop()
    assert "FileNotFoundError" not in beat.log()


def test_a_bad_setting_is_one_json_line_with_json(stack: Stack) -> None:
    env = {**stack.env, "ORCH_REVOKE_SIGNAL": "SIGFOO"}
    result = subprocess.run(
        [CLI, "show", "x", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "configuration_error" and "ORCH_REVOKE_SIGNAL" in error["message"]


def test_the_demo_piped_prints_clean_lines_and_leaves_no_folder(tmp_path: Path) -> None:
    env = {**_without_orch(dict(os.environ)), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [CLI, "demo"], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    heading = [line for line in result.stdout.splitlines() if "final records" in line]
    assert len(heading) == 1 and heading[0].startswith("─"), result.stdout
    assert "\x1b[" not in result.stdout, "no cursor movement or colour when piped"
    assert not list(tmp_path.glob("orchestration-demo-*"))


def test_the_shapes_example_runs_from_the_demo_with_branches_a_retry_and_an_approval(
    tmp_path: Path,
) -> None:
    env = {**_without_orch(dict(os.environ)), "TMPDIR": str(tmp_path), "COLUMNS": "140"}
    result = subprocess.run(
        [CLI, "demo", "--example", "shapes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "2=waiting for a slot" in out  # max_concurrency 2 held the third topic back
    assert "short=running (attempt 2)" in out or "short=completed" in out
    assert "approving step 'review' as the demo owner" in out
    assert '"decision": "approved"' in out and "[short]" in out and "[2]" in out
    assert not list(tmp_path.glob("orchestration-demo-*"))
    unknown = subprocess.run(
        [CLI, "demo", "--example", "nope"], env=env, capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "known: publish, research, shapes" in unknown.stderr


def test_an_interrupted_demo_leaves_no_folder(tmp_path: Path) -> None:
    # Unbuffered: a line printed into a pipe reaches the test when it is printed, so the
    # interrupt lands while the demo runs, not after it ended with its output unread.
    env = {**_without_orch(dict(os.environ)), "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    # SIGINT at its default in the demo: an ignored SIGINT is inherited, and a test that ran
    # before in this pytest process may have left it ignored (CI's full suite twice, not the
    # file alone); Python keeps an inherited SIG_IGN, and the demo then runs to its end.
    demo = subprocess.Popen(
        [CLI, "demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if "worker" in line and "ready" in line:
                break
        assert list(tmp_path.glob("orchestration-demo-*")), "the demo made its folder"
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
    assert demo.returncode != 0
    assert not list(tmp_path.glob("orchestration-demo-*"))


def test_the_publish_example_retries_its_draft_and_waits_for_approve(
    stack: Stack, worker: ManagedProcess
) -> None:
    launched = as_json(
        cli(
            stack,
            "launch",
            str(EXAMPLES / "publish.yaml"),
            "--args",
            '{"topic": "tides"}',
            "--json",
        )
    )
    run_id = launched["id"]
    wait_for(
        lambda: as_json(cli(stack, "show", run_id, "--json"))["park_reason"] == "approval",
        60,
        interval=0.5,
        what="the example parked for its approval",
    )
    shown = as_json(cli(stack, "show", run_id, "--json"))
    draft = shown["steps"][0]
    assert (draft["attempt"], draft["status"]) == (3, "completed")
    assert [a["error"] for a in draft["past_attempts"]] == ["the model was overloaded"] * 2
    decided = as_json(
        cli(stack, "approve", run_id, "--step", "review", "--comment", "ok", "--json")
    )
    assert decided["steps"][1]["output"]["decision"] == "approved"
    done = wait_for(
        lambda: (r := as_json(cli(stack, "show", run_id, "--json")))["status"] == "completed" and r,
        30,
        interval=0.5,
        what="the example completed",
    )
    assert done["result"] == {"post": "A post about tides.", "decision": "approved"}
    again = cli(stack, "approve", run_id, "--step", "review", "--json")
    assert again.returncode != 0 and "not waiting for a decision" in again.stdout + again.stderr
