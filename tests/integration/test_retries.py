"""Step retries through a real prefork worker (issue 12): the backoff is a countdown between
attempts, measured from the provider's own start journal; the third attempt succeeds; the last
failing attempt fails the run; a rate-limited turn is stopped before the next attempt."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from orchestration.providers.scripted import ScriptedProvider
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.integration.conftest import Stack
from tests.support.runs import finished

pytestmark = pytest.mark.integration


def _step(options: dict[str, Any], retry: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "retries",
        "steps": [
            {
                "id": "s1",
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.1,
                "max_poll_interval": 0.2,
                "with": options,
                "retry": retry,
            }
        ],
    }


def _starts(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    return ScriptedProvider(stack.settings).start_calls(f"{run_id}:")


def test_the_third_attempt_succeeds_after_backoffs_that_double(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    options = {"attempt_states": [[["failed"]], [["failed"]]], "states": [["completed"]]}
    run = orch.launch(
        _step(options, {"attempts": 3, "backoff": 0.5, "max_backoff": 10}), owner=owner
    )
    done = finished(orch, run.id, owner, timeout=30)
    assert (done.status, done.steps[0].attempt) == ("completed", 3), done.error
    starts = _starts(stack, run.id)
    assert [call["key"] for call in starts] == [f"{run.id}:s1:{n}" for n in (1, 2, 3)]
    assert {call["outcome"] for call in starts} == {"started"}
    ended = [attempt["ended_at"] for attempt in done.steps[0].past_attempts]
    gaps = [(starts[n + 1]["called_at"] - datetime_of(ended[n])).total_seconds() for n in range(2)]
    print(f"waits between attempts: {gaps[0]:.3f}s, {gaps[1]:.3f}s (backoff 0.5s, 1s)")
    # Never before the backoff; late by at most a poll hop and a worker's pickup.
    assert 0.5 <= gaps[0] < 0.5 + 1.0
    assert 1.0 <= gaps[1] < 1.0 + 1.0


def test_the_last_failing_attempt_fails_the_run(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    options = {"states": [["failed"]], "error": "model overloaded"}
    run = orch.launch(_step(options, {"attempts": 2, "backoff": 0.2}), owner=owner)
    done = finished(orch, run.id, owner, timeout=30)
    assert (done.status, done.stop_reason) == ("failed", "step_failed")
    assert done.error == "step s1: model overloaded (attempt 2 of 2)"
    assert [a["error"] for a in done.steps[0].past_attempts] == ["model overloaded"]
    assert len(_starts(stack, run.id)) == 2, "no third turn"


def test_a_rate_limited_turn_is_stopped_before_the_next_attempt_starts(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    # The provider says the limit resets 1 s after the turn began: the next attempt waits for
    # that (longer than the 0.2 s backoff), not for the turn's own 600 s.
    options = {
        "attempt_states": [[["rate_limited", 600]]],
        "reset_after": 1.0,
        "states": [["completed"]],
    }
    retry = {"attempts": 2, "backoff": 0.2, "on": ["rate_limited"]}
    run = orch.launch(_step(options, retry), owner=owner)
    done = finished(orch, run.id, owner, timeout=30)
    assert (done.status, done.steps[0].attempt) == ("completed", 2), done.error
    turns = {t["key"]: t for t in ScriptedProvider(stack.settings).turns(run.id)}
    first = turns[f"{run.id}:s1:1"]
    second = _starts(stack, run.id)[1]
    assert first["cancel_requested_at"] is not None, "attempt 1's turn was stopped"
    assert first["cancel_requested_at"] <= second["called_at"], "before attempt 2 started"
    waited = (second["called_at"] - first["started_at"]).total_seconds()
    print(f"attempt 2 started {waited:.3f}s after attempt 1 (limit reset after 1s)")
    assert waited >= 1.0, "attempt 2 waited for the provider's reset"
    assert done.steps[0].turn_stop["status"] == "stopped"


def datetime_of(text: str) -> datetime:
    return datetime.fromisoformat(text)
