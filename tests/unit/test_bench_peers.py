"""Item 1's peers (``bench.peers``), without installing them: the round order, the driver
protocol and process (a stand-in driver script run by this python, speaking the real
protocol module), a peer's rows from its driver's answers, and the table and target rows they
make. The real drivers run in ``make bench``."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import rounds, tables, targets
from bench.peers import venv
from bench.peers.driven import DBOSPeer, PrefectPeer, Row
from bench.peers.driver import DRIVERS, Driver, DriverError
from bench.peers.drivers.peer_protocol import FAILED, READY, TIMED, parse
from bench.peers.lineup import LOWEST, NORMAL, Lineup

STAND_IN = """
import sys, time
from peer_protocol import serve, timed

print("a library's own output on stdout")
if sys.argv[1:] == ["die"]:
    sys.exit("cannot reach the database")
if sys.argv[1:] == ["hang"]:
    time.sleep(60)
statuses = iter(["SUCCESS", "SUCCESS", "FAILED"])
serve(
    {"versions": {"stand-in": "1.0"}, "queue_polling_interval_s": 1.0,
     "await_polling_interval_s": 0.01},
    {
        "queue": lambda: timed(lambda: (time.sleep(0.02), next(statuses))[1]),
        "call": lambda: timed(lambda: "SUCCESS"),
        "boom": lambda: 1 / 0,
    },
)
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """A driver script beside a copy of the real protocol module, as the drivers sit."""
    folder = tmp_path / "drivers"
    folder.mkdir()
    shutil.copy(DRIVERS / "peer_protocol.py", folder / "peer_protocol.py")
    script = folder / "stand_in.py"
    script.write_text(STAND_IN)
    return script


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    """A folder whose ``bin/python`` is this interpreter: a virtualenv that is already there."""
    folder = tmp_path / "venv"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(sys.executable)
    return folder


def test_each_round_times_everyone_once_and_starts_with_a_different_contestant() -> None:
    plan = rounds.schedule(3, 5, "bare", ["engine", "director", "dbos queue", "prefect"])
    assert len(plan) == 5
    for contestants in plan[:3]:
        assert sorted(contestants) == sorted(
            ["bare", "engine", "director", "dbos queue", "prefect"]
        )
    assert [contestants[0] for contestants in plan[:3]] == ["bare", "engine", "director"]
    assert plan[1] == ["engine", "director", "dbos queue", "prefect", "bare"]
    assert plan[3:] == [["bare"], ["bare"]]
    assert rounds.order(7, []) == []


def test_the_protocol_reads_its_own_lines_and_skips_everything_else() -> None:
    assert parse(f'{TIMED} {{"mode": "queue", "seconds": 1.5, "status": "SUCCESS"}}\n') == (
        TIMED,
        {"mode": "queue", "seconds": 1.5, "status": "SUCCESS"},
    )
    assert parse(f'{READY} {{"versions": {{"dbos": "3.4.0"}}}}') == (
        READY,
        {"versions": {"dbos": "3.4.0"}},
    )
    assert parse(f'{FAILED} {{"error": "x"}}') == (FAILED, {"error": "x"})
    assert parse("10:50:26 [    INFO] (dbos) DBOS launched!") is None
    assert parse(f"{TIMED} not json") is None
    assert parse(f"{TIMED} [1, 2]") is None


def test_a_driver_answers_each_mode_and_reports_what_failed(stand_in: Path, tmp_path: Path) -> None:
    driver = Driver(Path(sys.executable), stand_in, [], {}, tmp_path / "stand_in.log")
    try:
        assert driver.wait_ready(30)["versions"] == {"stand-in": "1.0"}
        answer = driver.ask("queue", 30)
        assert answer["mode"] == "queue" and answer["status"] == "SUCCESS"
        assert 0.02 <= answer["seconds"] < 10
        with pytest.raises(DriverError, match="boom: ZeroDivisionError"):
            driver.ask("boom", 30)
        with pytest.raises(DriverError, match="unknown mode 'flow'"):
            driver.ask("flow", 30)
        assert driver.ask("call", 30)["status"] == "SUCCESS"
    finally:
        driver.close()
    assert driver.process.returncode == 0
    assert "ZeroDivisionError" in (tmp_path / "stand_in.log").read_text()


def test_a_driver_that_dies_or_hangs_ends_the_wait_with_its_error(
    stand_in: Path, tmp_path: Path
) -> None:
    dead = Driver(Path(sys.executable), stand_in, ["die"], {}, tmp_path / "dead.log")
    try:
        with pytest.raises(DriverError, match="cannot reach the database"):
            dead.wait_ready(30)
    finally:
        dead.close()
    hung = Driver(Path(sys.executable), stand_in, ["hang"], {}, tmp_path / "hung.log")
    try:
        with pytest.raises(DriverError, match=r"no answer in 0\.5 s"):
            hung.wait_ready(0.5)
    finally:
        hung.close(timeout=1)
    assert hung.process.returncode is not None


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


class StandInPeer(DBOSPeer):
    """DBOS's rows and description, its driver swapped for the stand-in (no database)."""

    def prepare(self, admin_url: str) -> tuple[list[str], dict[str, str]]:
        return [], {}


def test_a_peer_keeps_per_link_seconds_per_row_and_stops_a_row_at_a_failed_chain(
    stand_in: Path, fake_venv: Path, tmp_path: Path
) -> None:
    peer = StandInPeer(fake_venv, tmp_path, links=4)
    peer.script = stand_in
    try:
        peer.start("postgresql://unused")
        queue_row, call_row = peer.rows
        assert queue_row.error is None, queue_row.error
        assert "polled every 1 s, DBOS's default" in queue_row.how
        assert "polled every 10 ms" in queue_row.how
        for _ in range(3):
            for contestant in rounds.order(0, peer.contestants()):
                contestant()
    finally:
        peer.close()
    assert call_row.result(interleaved=True)["per_link_s"]["n"] == 3
    assert call_row.result(interleaved=True)["versions"] == {"stand-in": "1.0"}
    assert queue_row.statuses == ["SUCCESS", "SUCCESS", "FAILED"]
    assert queue_row.result(interleaved=True) == {
        "peer": "DBOS Transact",
        "label": "through its queue",
        "short": "DBOS queue",
        "skipped": "a chain of 4 ended FAILED, not SUCCESS",
    }


def test_a_peer_runs_at_the_lowest_priority_outside_its_own_turns(
    stand_in: Path, fake_venv: Path, tmp_path: Path
) -> None:
    peer = StandInPeer(fake_venv, tmp_path, links=4)
    peer.script = stand_in
    lineup = Lineup(driven=[peer])
    seen: list[int] = []
    try:
        peer.start("postgresql://unused")
        pid = peer.groups()[0]
        timed = peer.contestants()

        def watched(one: Callable[[], None]) -> Callable[[], None]:
            def time_one() -> None:
                seen.append(_nice(pid))
                one()

            return time_one

        peer.contestants = lambda: [watched(one) for one in timed]  # type: ignore[method-assign]
        with lineup.yielding():
            assert _nice(pid) == LOWEST
            for contestant in lineup.contestants():
                contestant()
                assert _nice(pid) == LOWEST
        assert _nice(pid) == NORMAL
    finally:
        peer.close()
    if os.geteuid() == 0:  # raising a priority back needs the right to
        assert seen == [NORMAL, NORMAL]
    assert [row.error for row in peer.rows] == [None, None]
    assert [len(row.seconds) for row in peer.rows] == [1, 1]


def test_a_peer_that_cannot_be_installed_or_is_the_wrong_version_says_why(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    error = venv.ensure(blocked / "venv", "dbos", "dbos")
    assert error is not None and error.startswith("python -m venv failed")
    prefect = PrefectPeer(tmp_path / "unused", tmp_path, 200, "sqlite")
    too_old = {"versions": {"prefect": "2.20.0"}, "server": "ephemeral", "database": "sqlite"}
    assert prefect.describe(too_old) == (
        "prefect 2.20.0 in its virtualenv; the bench measures Prefect 3"
    )
    assert prefect.describe({**too_old, "versions": {"prefect": "3.9.1"}}) is None
    assert "ephemeral API server" in prefect.rows[0].how
    assert "SQLite under `PREFECT_HOME` (Prefect's default)" in prefect.rows[0].how


def test_the_environment_of_a_peer_leaves_out_its_own_settings_and_ours(
    fake_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere/api")
    monkeypatch.setenv("VIRTUAL_ENV", "/our/venv")
    monkeypatch.setenv("ORCH_DATABASE_URL", "sqlite://")
    env = venv.environment(fake_venv, drop_prefixes=("PREFECT_",))
    assert "PREFECT_API_URL" not in env and "VIRTUAL_ENV" not in env
    assert env["ORCH_DATABASE_URL"] == "sqlite://"
    assert env["PATH"].startswith(str(fake_venv / "bin"))
    assert venv.ensure(fake_venv, "anything", "json") is None  # there already: no pip


def _report() -> dict[str, Any]:
    def spread(median: float) -> dict[str, float]:
        return {"median": median, "min": median, "max": median, "n": 3}

    queue = Row("dbos_queue", "DBOS Transact", "through its queue", "DBOS queue", "queue", 200)
    queue.versions, queue.how = {"dbos": "3.4.0"}, "enqueued"
    queue.seconds = [1.0, 1.0, 1.0]
    prefect = Row("prefect", "Prefect", "tasks in a flow", "Prefect", "flow", 200)
    prefect.error = "Prefect did not start: no answer in 300 s: Traceback\nOSError: port"
    return {
        "step_overhead": {
            "200": {
                "links": 200,
                "engine_per_link_s": spread(0.0075),
                "bare_per_link_s": spread(0.0025),
                "ratio": 3.0,
                "target_ratio": 1.5,
                "engine_executions_per_link": 1.0,
                "engine_execution_busy_s": {"p50": 0.006},
                "bare_execution_busy_s": {"p50": 0.001},
            }
        },
        "peer": {
            "versions": {"celery-director": "0.10.0", "celery": "5.5.1"},
            "links": 200,
            "interleaved_with_engine": True,
            "per_link_s": spread(0.0115),
            "per_link_without_end_sleep_s": spread(0.009),
        },
        "peers": {
            "dbos_queue": queue.result(interleaved=True),
            "prefect": prefect.result(interleaved=True),
        },
    }


def test_item_one_shows_each_peer_beside_the_engine_and_says_which_were_not_measured() -> None:
    text = tables.overhead(_report())
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert (
        " | 5.0 ms | 1.50x | 2.00x | 3 | enqueued |"
        in rows["DBOS Transact 3.4.0, through its queue"]
    )
    director = rows["celery-director 0.10.0 (Celery 5.5.1)"]
    assert " | 9.0 ms | 0.83x | 3.60x | 3 | " in director and "11.5 ms per link with it" in director
    assert "Timed in the same rounds as the engine's and the bare chains" in text
    assert "Not measured: Prefect, tasks in a flow: OSError: port." in text


def test_the_targets_state_the_engine_against_each_peer_without_inventing_a_goal() -> None:
    rows = {row["key"]: row for row in targets.evaluate(_report(), None)}
    dbos = rows["overhead_vs_dbos_queue"]
    assert dbos["reported"] and dbos["met"] is None
    assert dbos["vs_target"] == "1.50x DBOS (queue)"
    assert dbos["after"]["text"] == "7.5 ms per link; DBOS (queue) 5.0 ms"
    assert rows["overhead_vs_prefect"]["after"] is None
    assert rows["overhead_vs_director"]["met"] is True
    shown = targets.render(list(rows.values()), "971f8fd")
    assert "| 1.50x DBOS (queue) | reported, no target |" in shown
    goals = sum(1 for row in rows.values() if not row["reported"])
    assert f"of {goals} targets met; 3 rows state the engine against a peer" in shown


def test_the_real_drivers_compile_and_use_the_protocol_beside_them() -> None:
    for script in (DBOSPeer.script, PrefectPeer.script):
        source = script.read_text()
        compile(source, str(script), "exec")
        assert script.parent == DRIVERS and "from peer_protocol import serve, timed" in source
