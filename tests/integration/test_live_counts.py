"""On PostgreSQL the live-run counts are deferred triggers writing one slot per connection
(``orchestration.limits.live_counts``): concurrent launches and cancels keep them equal to a
count of the rows and never deadlock on them, and a launch's admission counts no run row."""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import event, text

from orchestration.core.db import get_engine, session_scope
from orchestration.core.states import RUN_LIVE
from orchestration.limits.live_counts import TOTAL
from orchestration.service import Orchestrator
from tests.conftest import DATABASE_URL
from tests.integration.conftest import Stack
from tests.unit.support import launch, step_spec, workflow
from tests.unit.test_live_counts import counted, kept

pytestmark = pytest.mark.skipif(
    not DATABASE_URL, reason="needs PostgreSQL (ORCH_TEST_DATABASE_URL): the deferred triggers"
)


def test_concurrent_launches_and_cancels_keep_the_counts(stack: Stack) -> None:
    settings = stack.settings
    owners = [f"counted-{uuid.uuid4().hex[:6]}-{n}" for n in range(3)]
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        orch = Orchestrator(settings, None)
        try:
            for n in range(24):
                owner = owners[(thread + n) % len(owners)]
                run_id = launch(settings, workflow(step_spec()), owner=owner)
                if n % 3:
                    orch.cancel(run_id, owner=owner)
        except BaseException as exc:  # reported below, with its thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    mine, truth = kept(settings), counted(settings)
    assert {o: mine.get(o) for o in owners} == {o: truth.get(o) for o in owners}
    assert sum(mine.get(o, 0) for o in owners) == 4 * 8
    assert mine[TOTAL] == truth[TOTAL]
    with session_scope(settings.database_url) as session:
        slots = session.scalar(
            text("SELECT count(DISTINCT slot) FROM live_run_counts WHERE owner = ANY(:o)"),
            {"o": owners},
        )
    assert slots and slots > 1  # the threads' connections wrote apart


def test_a_launch_reads_counts_and_its_owners_own_rows_never_a_run_row(stack: Stack) -> None:
    settings = stack.settings
    engine = get_engine(settings.database_url)
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
        if sql.lstrip().startswith("WITH"):
            seen.append((sql, params))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        launch(settings, workflow(step_spec()), owner=f"plan-{uuid.uuid4().hex[:6]}")
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    [(sql, params)] = seen
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        [[plan]] = cursor.fetchall()
    finally:
        raw.close()
    aggregates = list(_nodes(plan[0]["Plan"], "Aggregate"))
    # The live runs, in all and of the owner, and its live turns from the counts' rows; its
    # stored bytes (its artifacts, its inline outputs' counted bytes) from the owner's own
    # rows (issue 30), never another owner's.
    assert sorted(sorted(_relations(aggregate)) for aggregate in aggregates) == [
        ["artifacts"],
        ["inline_output_bytes"],
        ["live_run_counts"],
        ["live_run_counts"],
        ["live_turn_counts"],
    ], plan


def test_the_triggers_count_the_live_statuses_of_the_state_machine(stack: Stack) -> None:
    with session_scope(stack.settings.database_url) as session:
        triggers = dict(
            session.execute(
                text(
                    "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                    "WHERE tgrelid = 'runs'::regclass AND NOT tgisinternal"
                )
            ).all()
        )
    # The journal's, the inline outputs' (tests/unit/test_inline_output_bytes.py) and the live
    # turns' (tests/unit/test_live_turn_counts.py) apart.
    counting = {
        name: sql
        for name, sql in triggers.items()
        if "journal" not in name and "outputs" not in name and "turns" not in name
    }
    assert set(counting) == {
        "runs_live_inserted",
        "runs_live_ended",
        "runs_live_deleted",
        "runs_truncated",
    }
    live = {s.value for s in RUN_LIVE}
    for name, sets in (("runs_live_inserted", 1), ("runs_live_ended", 2), ("runs_live_deleted", 1)):
        sql = triggers[name]
        assert "DEFERRABLE INITIALLY DEFERRED" in sql, sql
        listed = re.findall(r"ARRAY\[([^\]]*)\]", sql)
        assert len(listed) == sets, sql
        for values in listed:
            assert set(re.findall(r"'(\w+)'", values)) == live, sql


def _nodes(node: dict[str, Any], kind: str) -> Any:
    if node.get("Node Type") == kind:
        yield node
    for child in node.get("Plans", []):
        yield from _nodes(child, kind)


def _relations(node: dict[str, Any]) -> set[str]:
    found = {node["Relation Name"]} if "Relation Name" in node else set()
    for child in node.get("Plans", []):
        found |= _relations(child)
    return found


def test_concurrent_outputs_and_ends_in_either_order_keep_the_inline_bytes(stack: Stack) -> None:
    """Transactions that write an output and then end a run, and others that end a run and
    then write an output, concurrently: the inline bytes equal the outputs' stored JSON. (Both
    take the count rows in one order, the slot's live total first, migration 0023; whether two
    of them share a slot is up to the backends' pids, so this checks the counts, not that.)"""
    settings = stack.settings
    owner = f"bytes-{uuid.uuid4().hex[:6]}"
    runs = [launch(settings, workflow(step_spec()), owner=owner) for _ in range(48)]
    errors: list[BaseException] = []
    output = text("UPDATE steps SET output = to_jsonb(CAST(:text AS text)) WHERE run_id = :run")
    end = text("UPDATE runs SET status = 'cancelled', cause = 'test' WHERE id = :run")

    def work(thread: int) -> None:
        try:
            for n, run_id in enumerate(runs[thread::4]):
                written = {"run": run_id, "text": "x" * (10 * thread + n)}
                with session_scope(settings.database_url) as session:
                    first, then = (output, end) if thread % 2 else (end, output)
                    session.execute(first, written)
                    session.execute(then, written)
        except BaseException as exc:  # reported below, with its thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with session_scope(settings.database_url) as session:
        kept_bytes = session.scalar(
            text("SELECT sum(bytes) FROM inline_output_bytes WHERE owner = :o"), {"o": owner}
        )
        stored = session.scalar(
            text(
                "SELECT sum(octet_length(output::text)) FROM steps JOIN runs ON runs.id = run_id "
                "WHERE owner = :o AND output <> 'null'::jsonb AND output_sha256 IS NULL"
            ),
            {"o": owner},
        )
    assert kept_bytes == stored > 0
    assert kept(settings).get(owner, 0) == counted(settings).get(owner, 0) == 0
