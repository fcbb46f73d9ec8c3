"""Stopping an owner (issue 30) on a real worker: ``owners suspend --cancel-live`` and ``POST
/operator/owners/{owner}/suspend`` with ``cancel_live`` end the owner's running runs terminal
through the cancel path, and on PostgreSQL a launch that races the suspension either commits
before it or is refused (never slips between)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import OwnerSuspended
from orchestration.limits import suspensions
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.conftest import wait_for
from tests.integration.conftest import Stack


def _flow() -> dict[str, Any]:
    """A step whose turn runs until it is cancelled."""
    return {
        "name": "endless",
        "steps": [
            {
                "id": "s1",
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.2,
                "max_poll_interval": 0.5,
                "with": {"states": [["running"]]},
            }
        ],
    }


def _cli(stack: Stack, *argv: str) -> subprocess.CompletedProcess[str]:
    command = str(Path(sys.executable).with_name("orchestration"))
    return subprocess.run(
        [command, *argv], env=stack.env, capture_output=True, text=True, timeout=120
    )


def test_cancel_live_ends_every_running_run_terminal_and_refuses_the_next_launch(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    runs = [orch.launch(_flow(), owner=owner).id for _ in range(5)]
    other = orch.launch(_flow(), owner=owner + "-b").id
    for run_id in runs:
        wait_for(
            lambda r=run_id: orch.get(r, owner=owner).steps[0].polls >= 1,  # type: ignore[misc]
            30,
            what=f"{run_id} polling",
        )
    started = time.perf_counter()
    done = _cli(
        stack, "owners", "suspend", owner, "--reason", "abuse", "--cancel-live", "--batch", "2"
    )
    print(
        f"suspend --cancel-live of {len(runs)} running runs: {time.perf_counter() - started:.2f}s"
    )
    assert done.returncode == 0, done.stderr
    assert f"cancelled 5 live runs of {owner}" in done.stdout
    for run_id in runs:
        record = orch.get(run_id, owner=owner)
        assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
        assert record.steps[0].status == "cancelled"
        assert stack.turns(run_id)[0]["cancel_requested_at"] is not None
        causes = [event["cause"] for event in orch.events(run_id, owner=owner)]
        assert any(cause.startswith("owner suspended: ") for cause in causes), causes
        assert "cancelled when its owner was suspended" in orch.explain(run_id, owner=owner)["why"]
    # The launch's own statement refuses it (on PostgreSQL, the one-statement launch).
    with pytest.raises(OwnerSuspended, match="is suspended since"):
        orch.launch(_flow(), owner=owner)
    assert orch.get(other, owner=owner + "-b").status == "running"
    orch.cancel(other, owner=owner + "-b")
    assert _cli(stack, "owners", "resume", owner).returncode == 0
    assert orch.launch(_flow(), owner=owner).status == "queued"


def test_an_operator_suspends_over_http_cancelling_the_running_runs_and_resumes(
    worker: ManagedProcess, orch: Orchestrator, owner: str, stack: Stack
) -> None:
    runs = [orch.launch(_flow(), owner=owner).id for _ in range(3)]
    for run_id in runs:
        wait_for(
            lambda r=run_id: orch.get(r, owner=owner).steps[0].polls >= 1,  # type: ignore[misc]
            30,
            what=f"{run_id} polling",
        )
    with session_scope(orch.settings.database_url) as session:
        token = tokens.create(session, None, "oncall", now=utcnow(), operator=True)
    operator = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    reply = operator.post(
        f"/operator/owners/{owner}/suspend", json={"reason": "abuse", "cancel_live": True}
    )
    assert reply.status_code == 201, reply.text
    assert (reply.json()["by"], reply.json()["cancelled"]) == ("operator oncall", 3)
    for run_id in runs:
        record = orch.get(run_id, owner=owner)
        assert (record.status, record.steps[0].status) == ("cancelled", "cancelled")
        assert stack.turns(run_id)[0]["cancel_requested_at"] is not None
        causes = [event["cause"] for event in orch.events(run_id, owner=owner)]
        assert f"owner suspended: owner {owner!r} suspended by operator oncall (abuse)" in causes
    with pytest.raises(OwnerSuspended):
        orch.launch(_flow(), owner=owner)
    assert operator.post(f"/operator/owners/{owner}/resume").json()["resumed"] is True
    launched = orch.launch(_flow(), owner=owner)
    orch.cancel(launched.id, owner=owner)


def test_a_launch_racing_a_suspension_waits_for_it_then_is_refused(
    orch: Orchestrator, owner: str, stack: Stack
) -> None:
    if not stack.settings.database_url.startswith("postgresql"):
        pytest.skip("the suspension's lock is PostgreSQL's; SQLite has one writer")
    url = stack.settings.database_url
    outcome: list[BaseException | str] = []

    def launch() -> None:
        try:
            outcome.append(orch.launch(_flow(), owner=owner).id)
        except BaseException as exc:
            outcome.append(exc)

    with session_scope(url) as session:
        suspensions.suspend(session, owner, utcnow(), reason="race", by="test")
        racer = threading.Thread(target=launch)
        racer.start()
        with session_scope(url) as probe:

            def waiting() -> bool:
                return bool(
                    probe.scalar(
                        text(
                            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                            " WHERE c.relname = 'owner_suspensions' AND NOT l.granted"
                        )
                    )
                )

            wait_for(waiting, 20, what="the launch waiting on the suspension's lock")
    racer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], OwnerSuspended), outcome
