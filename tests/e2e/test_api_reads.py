"""Cheap reads (issue 10) over real HTTP: a list carries summaries, never payloads, and stays
owner-scoped; a health filter is exact; ``/metrics`` reads counts from indexes, never the
journal, and its figures are the database's; health in SQL agrees with ``health.derive``."""

from __future__ import annotations

import itertools
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine

from orchestration.core import health as judgement
from orchestration.core import status_triggers
from orchestration.core.db import get_engine, session_scope, upgrade
from orchestration.core.deadlines import park_expiry
from orchestration.core.models import Run, RunEvent
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_TERMINAL,
    UNATTENDED_PARKS,
    ConcurrencyState,
    Health,
    ParkReason,
    RunStatus,
)
from orchestration.reads.summaries import ERROR_CHARS, listing
from orchestration.runtime.executor import Executor
from orchestration.runtime.processes import ManagedProcess
from orchestration.surfaces.api.metrics import SETTLE, RunMetrics
from orchestration.upkeep import retention
from tests.conftest import wait_for
from tests.e2e.conftest import ApiServer, make_token, scripted
from tests.integration import conftest as integration
from tests.integration.conftest import Stack
from tests.unit.support import insert_run

pytestmark = pytest.mark.e2e

LONG = [["running"]]
#: What a list must never carry: the run's workflow, args and result, and step payloads.
PAYLOAD_KEYS = {"workflow", "args", "result", "steps", "input", "output", "prompt", "answer"}
PAYLOAD_COLUMNS = re.compile(
    r"\b(runs\.(workflow|args|result|task_ids)|steps\.(input|output|prompt|answer))\b"
)


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _until(client: httpx.Client, run_id: str, status: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        record: dict[str, Any] = _ok(client.get(f"/runs/{run_id}"))
        return record if record["status"] == status else None

    result: dict[str, Any] = wait_for(check, 30, interval=0.1, what=f"run {status}")
    return result


class Statements:
    """The SQL this process sends while the block runs (the API serves from a thread here)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: list[str] = []

    def _record(self, *args: Any) -> None:
        self.seen.append(str(args[2]))

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)


def test_list_answers_carry_summaries_and_detail_has_the_payloads(
    api: ApiServer, worker: ManagedProcess, stack: Stack, token: str
) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    flow = scripted([["completed"]], output=f"output-{marker}")
    failing = scripted([["failed"]], error="E" * 1000, name="fails")
    with api.client(token) as client:
        run = _ok(client.post("/runs", json={"workflow": flow, "args": {"topic": marker}}), 201)
        broken = _ok(client.post("/runs", json={"workflow": failing}), 201)
        done = _until(client, run["id"], "completed")
        failed = _until(client, broken["id"], "failed")
        with Statements(get_engine(stack.settings.database_url)) as sql:
            listed = client.get("/runs")
            stalled = client.get("/runs", params={"health": "ended"})
        dashboard = client.get("/dashboard")
        detail = client.get(f"/runs/{run['id']}")
    for response in (listed, stalled, dashboard):
        assert response.status_code == 200, response.text
        assert marker not in response.text
    runs = {r["id"]: r for r in listed.json()["runs"]}
    assert set(runs) == {run["id"], broken["id"]}
    for summary in runs.values():
        assert not PAYLOAD_KEYS & set(summary), summary
    assert runs[run["id"]]["status"] == "completed" and runs[run["id"]]["health"] == "ended"
    assert runs[run["id"]]["current_step_id"] == "s1"
    # The error is cut in the list and whole in the record.
    assert len(failed["error"]) > ERROR_CHARS
    assert len(runs[broken["id"]]["error"]) == ERROR_CHARS
    assert runs[broken["id"]]["error"].endswith("…")
    assert failed["error"].startswith(runs[broken["id"]]["error"][:-1])
    # Column-only reads: no statement of either list names a payload column.
    lists = [s for s in sql.seen if "FROM runs" in s]
    assert len(lists) == 2, sql.seen
    for statement in lists:
        assert not PAYLOAD_COLUMNS.search(statement), statement
    assert marker in detail.text
    assert done["args"] == {"topic": marker} and done["result"] == f"output-{marker}"
    assert done["steps"][0]["output"] == f"output-{marker}"


def test_list_stays_owner_scoped_under_every_filter(
    api: ApiServer, worker: ManagedProcess, stack: Stack, owner: str, token: str
) -> None:
    other = make_token(stack, owner + "-other")
    with api.client(token) as mine, api.client(other) as theirs:
        my_run = _ok(mine.post("/runs", json={"workflow": scripted(LONG)}), 201)
        their_run = _ok(theirs.post("/runs", json={"workflow": scripted(LONG)}), 201)
        _until(mine, my_run["id"], "running")
        _until(theirs, their_run["id"], "running")
        for params in ({}, {"status": "running"}, {"health": "working"}, {"limit": 500}):
            assert [r["id"] for r in _ok(mine.get("/runs", params=params))["runs"]] == [
                my_run["id"]
            ]
            assert [r["id"] for r in _ok(theirs.get("/runs", params=params))["runs"]] == [
                their_run["id"]
            ]
        assert _ok(mine.get("/runs", params={"health": "stalled"}))["runs"] == []
        _ok(mine.post(f"/runs/{my_run['id']}/cancel"))
        _ok(theirs.post(f"/runs/{their_run['id']}/cancel"))


def test_a_health_filter_pages_exactly(api: ApiServer, worker: ManagedProcess, token: str) -> None:
    with api.client(token) as client:
        ids = [
            _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)["id"]
            for _ in range(3)
        ]
        for run_id in ids:
            _until(client, run_id, "running")
        _ok(client.post(f"/runs/{ids[1]}/cancel"))
        working = _ok(client.get("/runs", params={"health": "working", "limit": 1}))
        assert [r["id"] for r in working["runs"]] == [ids[2]] and working["next_cursor"]
        rest = _ok(
            client.get(
                "/runs", params={"health": "working", "limit": 1, "cursor": working["next_cursor"]}
            )
        )
        assert [r["id"] for r in rest["runs"]] == [ids[0]]
        ended = _ok(client.get("/runs", params={"health": "ended"}))
        assert [r["id"] for r in ended["runs"]] == [ids[1]] and ended["next_cursor"] is None
        for run_id in (ids[0], ids[2]):
            _ok(client.post(f"/runs/{run_id}/cancel"))


def _samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def _database_figures(stack: Stack) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """Runs by (status, health) judged the slow way, one run at a time, and terminal
    transitions by (status, stop_reason) from the journal: what the metrics used to compute."""
    with session_scope(stack.settings.database_url) as session:
        now = datetime.now(UTC)
        runs: Counter[tuple[str, str]] = Counter()
        for run in session.scalars(select(Run)).all():
            judged = judgement.judge(session, stack.settings, run.id, now)
            assert judged is not None
            runs[(run.status, judged.health.value)] += 1
        journal = Counter(
            {
                (status, str(reason)): count
                for status, reason, count in session.execute(
                    select(RunEvent.to_status, RunEvent.stop_reason, func.count())
                    .where(RunEvent.step_id.is_(None), RunEvent.stop_reason.is_not(None))
                    .group_by(RunEvent.to_status, RunEvent.stop_reason)
                )
            }
        )
    return runs, journal


def test_metrics_parse_match_the_database_and_never_read_the_journal(
    api: ApiServer, worker: ManagedProcess, stack: Stack, token: str
) -> None:
    with api.client(token) as client:
        done = _ok(client.post("/runs", json={"workflow": scripted([["completed"]])}), 201)
        cancelled = _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)
        running = _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)
        _until(client, done["id"], "completed")
        _until(client, cancelled["id"], "running")
        _until(client, running["id"], "running")
        _ok(client.post(f"/runs/{cancelled['id']}/cancel"))
        with Statements(get_engine(stack.settings.database_url)) as sql:
            text = client.get("/metrics").text
        runs, journal = _database_figures(stack)
        _ok(client.post(f"/runs/{running['id']}/cancel"))
    samples = _samples(text)
    assert samples["orchestration_metrics_database_up"][()] == 1
    served_runs = {
        (dict(labels)["status"], dict(labels)["health"]): value
        for labels, value in samples["orchestration_runs"].items()
        if value
    }
    assert served_runs == dict(runs)
    served_stops = {
        (dict(labels)["status"], dict(labels)["stop_reason"]): value
        for labels, value in samples["orchestration_run_terminal_transitions"].items()
        if value
    }
    assert served_stops == dict(journal)
    assert samples["orchestration_runs_past_deadline"][()] == 0
    latency = samples["orchestration_cancel_to_terminal_seconds"]
    assert latency[(("le", "+Inf"),)] == runs[("cancelled", "ended")] >= 1
    # Five statements (three on runs, one for the sweeper, one for the busiest owners'
    # budgets); none reads the journal or a payload.
    assert len(sql.seen) <= 5, sql.seen
    for statement in sql.seen:
        assert "run_events" not in statement and not PAYLOAD_COLUMNS.search(statement)


def test_metrics_keep_settled_totals_without_counting_twice(
    api: ApiServer, worker: ManagedProcess, stack: Stack, token: str
) -> None:
    with api.client(token) as client:
        run = _ok(client.post("/runs", json={"workflow": scripted([["completed"]])}), 201)
        _until(client, run["id"], "completed")
    now = datetime.now(UTC)
    clock = iter([now, now + 2 * SETTLE, now + 3 * SETTLE])
    collector = RunMetrics(stack.settings, lambda: next(clock))
    figures = []
    for _ in range(3):
        families = {family.name: family for family in collector.collect()}
        figures.append(
            {
                tuple(sorted(s.labels.items())): s.value
                for s in families["orchestration_run_terminal_transitions"].samples
            }
        )
    # Read fresh, then from the settled totals (the run finished > SETTLE before), then again.
    assert figures[0] == figures[1] == figures[2]
    assert figures[0][(("status", "completed"), ("stop_reason", "completed"))] >= 1


@pytest.fixture()
def scratch(tmp_path: Path) -> Iterator[Settings]:
    """An empty database of its own (PostgreSQL under CI), with no worker or sweeper."""
    url, drop = integration._fresh_database(tmp_path, f"orch_reads_{uuid.uuid4().hex[:8]}")
    settings = Settings(database_url=url)
    upgrade(settings.database_url)
    yield settings
    if drop is not None:
        drop()


def _reference(settings: Settings, run: Run, now: datetime) -> str:
    """The health rules as docs/concepts.md states them, over a row in Python: the test's
    oracle for the one SQL expression (``orchestration.core.health``)."""
    dead = now > (run.heartbeat_at or run.created_at) + timedelta(
        seconds=settings.heartbeat_timeout
    )
    if run.status in RUN_TERMINAL:
        return Health.ENDED.value
    if run.status == RunStatus.PARKED:
        expired = run.parked_since is not None and now > park_expiry(
            settings, run.park_reason, run.parked_since, run.waiting_until
        )
        polled = run.park_reason not in UNATTENDED_PARKS
        return (Health.STALLED if expired or (polled and dead) else Health.WAITING).value
    if run.status == RunStatus.QUEUED and run.concurrency in (
        ConcurrencyState.QUEUED,
        ConcurrencyState.SLOT,
    ):
        return Health.WAITING.value
    return (Health.STALLED if dead else Health.WORKING).value


def test_health_at_every_boundary_is_the_rules_in_every_read(scratch: Settings) -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    beat = scratch.heartbeat_timeout
    tick = timedelta(microseconds=1)
    reasons = [None, *(reason.value for reason in ParkReason), "something_else"]
    runs: list[Run] = []
    for number, (status, reason, heartbeat, parked, waiting, claim) in enumerate(
        itertools.product(
            list(RunStatus),
            reasons,
            [None, timedelta(seconds=1), timedelta(seconds=beat), timedelta(seconds=beat) + tick],
            ["none", "fresh", "at", "past"],
            [None, timedelta(seconds=-5), timedelta(seconds=5)],
            [None, "queued"],
        )
    ):
        budget = timedelta(seconds=scratch.park_budget(reason))
        since = {"none": None, "fresh": now, "at": now - budget, "past": now - budget - tick}
        runs.append(
            Run(
                id=f"r{number:06d}",
                owner="grid",
                request_id=f"r{number}",
                fingerprint="f",
                workflow_name="grid",
                workflow={},
                args={},
                status=status.value,
                created_at=now - timedelta(seconds=beat) - tick,
                updated_at=now,
                heartbeat_at=None if heartbeat is None else now - heartbeat,
                park_reason=reason,
                parked_since=since[parked],
                waiting_until=None if waiting is None else now + waiting,
                concurrency=claim,
                task_ids=[],
                current_step=0,
                rearms=0,
                needs_review=False,
                cause="a test's grid",
            )
        )
    expected = {run.id: _reference(scratch, run, now) for run in runs}
    with (
        session_scope(scratch.database_url) as session,
        status_triggers.suspended(session.connection()),
    ):
        session.add_all(runs)
        session.flush()
    with session_scope(scratch.database_url) as session:
        summaries = listing(session, scratch, owner="grid", now=now, limit=len(runs) + 1)
        assert {s.id: s.health for s in summaries} == expected
        for run_id in list(expected)[:: max(1, len(expected) // 200)]:
            judged = judgement.judge(session, scratch, run_id, now)
            assert judged is not None and judged.health.value == expected[run_id], run_id
        for health in Health:
            chosen = listing(session, scratch, owner="grid", now=now, health=health, limit=10**5)
            assert {s.id for s in chosen} == {k for k, v in expected.items() if v == health}
    # The grid reaches every health.
    assert set(expected.values()) == {h.value for h in Health}


def _counters(collector: RunMetrics) -> dict[str, dict[tuple[Any, ...], float]]:
    """The run counters of one scrape: terminal transitions and the cancel histogram (its
    sum to the millisecond: SQLite's ``julianday`` differences are that precise)."""
    families = {family.name: family for family in collector.collect()}
    return {
        name: {
            (sample.name, *sorted(sample.labels.items())): round(sample.value, 3)
            for sample in families[name].samples
        }
        for name in (
            "orchestration_run_terminal_transitions",
            "orchestration_cancel_to_terminal_seconds",
        )
    }


def test_metrics_counters_never_go_down_when_runs_are_pruned(scratch: Settings) -> None:
    now = datetime.now(UTC)
    for status, reason, ago, latency in (
        ("completed", "completed", timedelta(hours=3), None),
        ("cancelled", "cancel_requested", timedelta(hours=3), 0.3),
        ("cancelled", "cancel_requested", timedelta(minutes=5), 2.0),
        ("failed", "step_failed", timedelta(minutes=10), None),
    ):
        finished = now - ago
        insert_run(
            scratch,
            status,
            now=finished - timedelta(seconds=5),
            finished_at=finished,
            stop_reason=reason,
            cancel_requested_at=None if latency is None else finished - timedelta(seconds=latency),
        )
    insert_run(scratch, "running", now=now)
    early = RunMetrics(scratch, lambda: now)
    before = _counters(early)
    transitions = before["orchestration_run_terminal_transitions"]
    assert sum(transitions.values()) == 4
    report = retention.prune(Executor(scratch, None), cutoff=now)
    assert report["runs"] == 4
    again = retention.prune(Executor(scratch, None), cutoff=now)  # nothing left: adds nothing
    assert again["runs"] == 0
    # The collector that read them as rows, and a fresh process's, read the same counters.
    assert _counters(early) == before
    assert _counters(RunMetrics(scratch, lambda: now)) == before
    # A later scrape that settles the pruned hours still counts each run once.
    later = now + 3 * SETTLE
    assert _counters(RunMetrics(scratch, lambda: later)) == before
    insert_run(
        scratch,
        "completed",
        now=now,
        finished_at=now + timedelta(seconds=1),
        stop_reason="completed",
    )
    after = _counters(early)["orchestration_run_terminal_transitions"]
    assert (
        after[
            (
                "orchestration_run_terminal_transitions_total",
                ("status", "completed"),
                ("stop_reason", "completed"),
            )
        ]
        == 2
    )
    latency = before["orchestration_cancel_to_terminal_seconds"]
    assert latency[("orchestration_cancel_to_terminal_seconds_count",)] == 2
    assert round(latency[("orchestration_cancel_to_terminal_seconds_sum",)], 3) == 2.3
