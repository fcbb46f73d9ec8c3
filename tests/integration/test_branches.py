"""Branching steps through real prefork workers and beat (issue 12): ``max_concurrency`` holds
(measured from the provider's own start journal), ``join: all`` fails fast and stops the
siblings' turns, ``all_settled`` waits, a branch parks for a human, a duplicated branch message
starts one turn, a worker killed as the last branches settle still joins once, and a cancel
mid-fan-out leaves no live turn."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.core.db import session_scope
from orchestration.core.followups import ChainPlan, Link
from orchestration.core.models import RunEvent
from orchestration.providers.scripted import ScriptedProvider
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.runs import finished

pytestmark = pytest.mark.integration

#: Long enough for several branches to overlap, short enough for the suite.
TURN_SECONDS = 0.8


def _branch(states: list[Any], **options: Any) -> dict[str, Any]:
    return {
        "provider": "scripted",
        "poll_interval": 0.1,
        "max_poll_interval": 0.2,
        "with": {"states": states, **options},
    }


def _research(max_concurrency: int, states: list[Any] | None = None) -> dict[str, Any]:
    return {
        "name": "research",
        "steps": [
            {
                "id": "research",
                "for_each": "{{ args.topics }}",
                "max_concurrency": max_concurrency,
                "step": {
                    **_branch(states or [["running", TURN_SECONDS], ["completed"]]),
                    "task": "Research {{ item }}",
                },
            },
            {**_branch([["completed"]]), "id": "summary", "task": "{{ steps.research.output }}"},
        ],
    }


def _drafts(join: str, *branches: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "drafts",
        "steps": [{"id": "drafts", "parallel": {"join": join, "steps": list(branches)}}],
    }


def _starts(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    return ScriptedProvider(stack.settings).start_calls(f"{run_id}:")


def _branch_runs(orch: Orchestrator, run_id: str, owner: str) -> list[dict[str, Any]]:
    return orch.get(run_id, owner=owner).steps[0].branches or []


def test_for_each_never_runs_more_than_max_concurrency_at_once(
    worker: ManagedProcess, beat: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    topics = [f"t{n}" for n in range(6)]
    run = orch.launch(_research(2), {"topics": topics}, owner=owner)
    done = finished(orch, run.id, owner, timeout=60)
    assert done.status == "completed", done.error
    assert done.steps[0].output == [f"Research {t}" for t in topics]
    assert done.steps[1].output == done.steps[0].output
    spans = []
    for branch in done.steps[0].branches or []:
        (call,) = _starts(stack, branch["run_id"])
        spans.append((call["called_at"], call["called_at"] + timedelta(seconds=TURN_SECONDS)))
    # The most turns running at once, from the provider's own clock.
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    print(f"most branch turns running at once: {most} (max_concurrency 2, 6 branches)")
    assert most == 2


def test_join_all_fails_fast_and_stops_the_siblings_turns(
    worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    flow = _drafts(
        "all",
        {
            **_branch([["running", 0.5], ["failed"]], error="model refused"),
            "id": "bad",
            "task": "b",
        },
        {**_branch([["running"]]), "id": "slow", "task": "s"},
    )
    run = orch.launch(flow, owner=owner)
    done = finished(orch, run.id, owner, timeout=30)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert "branch bad" in (done.error or "") and "model refused" in (done.error or "")
    slow = next(b for b in done.steps[0].branches or [] if b["id"] == "slow")
    slow_run = finished(orch, slow["run_id"], owner, timeout=20)
    assert (slow_run.status, slow_run.stop_reason) == ("cancelled", "parent_ended")
    wait_for(
        lambda: all(t["cancel_requested_at"] for t in stack.turns(slow["run_id"])),
        20,
        interval=0.1,
        what="the sibling's provider turn cancelled",
    )


def test_all_settled_waits_for_every_branch(
    worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    flow = _drafts(
        "all_settled",
        {**_branch([["failed"]], error="nope"), "id": "bad", "task": "b"},
        {**_branch([["running", 1.5], ["completed"]]), "id": "slow", "task": "s"},
    )
    run = orch.launch(flow, owner=owner)
    done = finished(orch, run.id, owner, timeout=30)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert [b["status"] for b in done.steps[0].branches or []] == ["failed", "completed"]
    assert done.steps[0].branches[1]["output"] == "s"  # type: ignore[index]


def test_a_branch_parks_for_a_human_and_the_answer_resumes_it_once(
    worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    flow = _drafts(
        "all",
        {**_branch([["completed"]]), "id": "plain", "task": "p"},
        {**_branch([["input_required"]], prompt="tone?"), "id": "ask", "task": "a"},
    )
    run = orch.launch(flow, owner=owner)
    ask = wait_for(
        lambda: next((b for b in _branch_runs(orch, run.id, owner) if b["id"] == "ask"), None),
        20,
        interval=0.1,
        what="the branches made",
    )
    wait_for(
        lambda: orch.get(ask["run_id"], owner=owner).park_reason == "human",
        20,
        interval=0.1,
        what="the branch parked for a human",
    )
    assert orch.get(run.id, owner=owner).park_reason == "branches"
    orch.answer(ask["run_id"], "ask", "dry", owner=owner)
    done = finished(orch, run.id, owner, timeout=30)
    assert (done.status, done.result) == ("completed", {"plain": "p", "ask": "dry"})
    assert [c["key"] for c in _starts(stack, ask["run_id"])] == [
        f"{ask['run_id']}:ask:1",
        f"{ask['run_id']}:ask:2",
    ]


def test_a_duplicated_branch_message_starts_one_turn(
    worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(
        _research(4, [["running", 1.0], ["completed"]]), {"topics": ["a", "b"]}, owner=owner
    )
    first = wait_for(
        lambda: next(iter(_branch_runs(orch, run.id, owner)), None),
        20,
        interval=0.05,
        what="the branches made",
    )
    queue = client_queue(stack.settings)
    for _ in range(3):  # a redelivered first message, as Redis or a re-arm would send it
        queue.send_chain(ChainPlan(first["run_id"], (Link(0, uuid.uuid4().hex, 0),)))
    done = finished(orch, run.id, owner, timeout=30)
    assert done.status == "completed", done.error
    calls = _starts(stack, first["run_id"])
    assert [c["outcome"] for c in calls] == ["started"], calls


def test_a_worker_killed_as_the_last_branches_settle_still_joins_once(
    stack: Stack, beat: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    doomed = stack.start_worker("doomed", concurrency=2)
    run = orch.launch(
        _research(2, [["running", 1.0], ["completed"]]), {"topics": ["a", "b"]}, owner=owner
    )
    wait_for(
        lambda: (
            len([c for b in _branch_runs(orch, run.id, owner) for c in _starts(stack, b["run_id"])])
            == 2
        ),
        20,
        interval=0.02,
        what="both branch turns started",
    )
    time.sleep(1.0)  # both turns finish now: their last polls and the join race the kill
    doomed.signal(signal.SIGKILL)
    doomed.proc.wait(10)
    doomed.stop()  # already dead: this closes its log
    stack.processes.remove(doomed)
    stack.start_worker("rescuer")
    done = finished(orch, run.id, owner, timeout=90)
    assert done.status == "completed", done.error
    with session_scope(stack.settings.database_url) as session:
        joined = session.scalars(
            select(RunEvent.id).where(
                RunEvent.run_id == run.id,
                RunEvent.step_id == "research",
                RunEvent.to_status == "completed",
            )
        ).all()
    assert len(joined) == 1
    assert [c["outcome"] for c in _starts(stack, run.id)] == ["started"]  # summary: one turn


def test_a_cancel_mid_fan_out_leaves_no_live_turn(
    worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(_research(2, [["running"]]), {"topics": ["a", "b", "c", "d"]}, owner=owner)
    wait_for(
        lambda: (
            len([b for b in _branch_runs(orch, run.id, owner) if _starts(stack, b["run_id"])]) == 2
        ),
        20,
        interval=0.05,
        what="two branch turns started",
    )
    record = orch.cancel(run.id, owner=owner)
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
    branches = record.steps[0].branches or []
    assert {b["status"] for b in branches} == {"cancelled"}
    started = [b for b in branches if _starts(stack, b["run_id"])]
    assert len(started) == 2
    for branch in started:
        assert all(t["cancel_requested_at"] for t in stack.turns(branch["run_id"]))
    time.sleep(2.0)  # nothing admits the waiting branches after the cancel
    for branch in branches:
        assert len(_starts(stack, branch["run_id"])) == (1 if branch in started else 0)


def test_a_rerun_runs_only_the_branches_that_did_not_complete(
    worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    flow = _drafts(
        "all",
        {**_branch([["completed"]]), "id": "quick", "task": "q"},
        {**_branch([["running", 1.5], ["completed"]]), "id": "slow", "task": "s"},
    )
    source = orch.launch(flow, owner=owner)
    wait_for(
        lambda: [b["status"] for b in _branch_runs(orch, source.id, owner)][:1] == ["completed"],
        20,
        interval=0.05,
        what="the quick branch completed",
    )
    assert orch.cancel(source.id, owner=owner).status == "cancelled"
    rerun = orch.rerun(source.id, owner=owner)
    done = finished(orch, rerun.id, owner, timeout=30)
    assert (done.status, done.result) == ("completed", {"quick": "q", "slow": "s"})
    quick, slow = done.steps[0].branches or []
    assert (_starts(stack, quick["run_id"]), len(_starts(stack, slow["run_id"]))) == ([], 1)
    causes = [e["cause"] for e in orch.events(quick["run_id"], owner=owner)]
    assert any("output reused from branch run" in cause for cause in causes), causes
