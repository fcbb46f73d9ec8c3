"""Launch-time checks share one deadline: a workflow's distinct unlisted hosts are looked up
concurrently, in a bounded pool, within ``ORCH_LAUNCH_CHECK_SECONDS``, and at most
``ORCH_MAX_LAUNCH_HOSTS`` of them. A launch, a ``POST /workflows`` and a schedule fire each
hold their thread no longer than the budget.

Names are resolved by a stand-in for the system resolver (``socket.getaddrinfo`` patched):
no real lookup is made, and no connection either.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestration.core.db import session_scope
from orchestration.core.egress import AllowList
from orchestration.core.errors import ValidationError
from orchestration.core.followups import Done
from orchestration.core.models import ScheduleFire
from orchestration.core.settings import Settings
from orchestration.limits import host_lookups
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep import schedules
from orchestration.workflows import parsing, registry
from tests.unit.support import RecordingDispatcher

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
BUDGET = 0.6
#: What a check may take beyond its budget on a loaded 2-core machine (SQLite, threads).
SLACK = 0.6


class Names:
    """The stand-in resolver: ``*.test`` names answer 127.0.0.1 after ``delay`` seconds, or
    never (until the test ends) when ``stuck``; it counts the lookups."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.stuck = False
        self.asked: list[str] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def getaddrinfo(self, host: str, *args: Any, **kwargs: Any) -> list[Any]:
        if not str(host).endswith(".test"):
            raise AssertionError(f"a real lookup was attempted: {host!r}")
        with self.lock:
            self.asked.append(str(host))
        if self.stuck:
            self.release.wait(30)
        elif self.delay:
            time.sleep(self.delay)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Iterator[Names]:
    stand_in = Names()
    monkeypatch.setattr(socket, "getaddrinfo", stand_in.getaddrinfo)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    yield stand_in
    stand_in.release.set()


@pytest.fixture
def fast(settings_factory: Callable[..., Settings]) -> Settings:
    return settings_factory(launch_check_seconds=BUDGET, max_launch_hosts=16)


def http_step(index: int, host: str) -> dict[str, Any]:
    base = f"http://{host}:8080"
    return {
        "id": f"s{index}",
        "provider": "http",
        "task": "t",
        "with": {
            "start": {"url": f"{base}/runs"},
            "status": {"url": f"{base}/runs/{{run_id}}"},
            "cancel": {"url": f"{base}/runs/{{run_id}}/cancel"},
            "run_id_path": "id",
            "status_path": "state",
        },
    }


def many_hosts(count: int, name: str = "wide", **extra: Any) -> dict[str, Any]:
    steps = [http_step(index, f"h{index}.slow.test") for index in range(count)]
    return {"name": name, "steps": steps, **extra}


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    try:
        outcome = call()
    except Exception as exc:
        outcome = exc
    return time.perf_counter() - began, outcome


# --- one deadline, concurrent lookups ------------------------------------------------------


def test_six_slow_names_are_looked_up_at_once_not_one_after_another(
    names: Names, fast: Settings
) -> None:
    """On the old serial checks six names of 0.5 s each took 3 s; together they take 0.5 s."""
    names.delay = 0.5
    settings = fast.model_copy(update={"launch_check_seconds": 2.0})
    elapsed, spec = timed(lambda: parsing.parse(many_hosts(6), settings))
    assert not isinstance(spec, Exception), spec
    assert elapsed < 0.5 + SLACK, elapsed
    assert sorted(names.asked) == sorted(f"h{i}.slow.test" for i in range(6))


def test_names_that_never_answer_refuse_the_launch_at_its_budget(
    names: Names, fast: Settings
) -> None:
    names.stuck = True
    elapsed, refused = timed(lambda: parsing.parse(many_hosts(12), fast))
    assert isinstance(refused, ValidationError), refused
    assert elapsed < BUDGET + SLACK, elapsed
    assert refused.field == "steps[0].with.start.url"
    assert "ORCH_LAUNCH_CHECK_SECONDS" in refused.problem
    assert "add h0.slow.test:8080 to ORCH_PROVIDER_HOSTS" in refused.problem


def test_a_name_is_looked_up_once_per_launch(names: Names, fast: Settings) -> None:
    steps = [http_step(index, "same.slow.test") for index in range(5)]
    parsing.parse({"name": "same", "steps": steps}, fast)
    assert names.asked == ["same.slow.test"]


def test_the_distinct_unlisted_names_are_capped(names: Names, fast: Settings) -> None:
    capped = fast.model_copy(update={"max_launch_hosts": 3})
    with pytest.raises(ValidationError) as caught:
        parsing.parse(many_hosts(4), capped)
    assert caught.value.field == "steps[3].with.start.url"
    assert "ORCH_MAX_LAUNCH_HOSTS" in caught.value.problem
    assert "over the limit of 3" in caught.value.problem
    assert len(names.asked) <= 3
    listed = capped.model_copy(
        update={"provider_hosts": ",".join(f"h{i}.slow.test" for i in range(4))}
    )
    parsing.parse(many_hosts(4), listed)  # names listed by name are never looked up


def test_the_lookup_threads_are_bounded_whatever_the_launches(names: Names, fast: Settings) -> None:
    names.stuck = True
    allow = AllowList.parse("127.0.0.0/8")

    def launch(number: int) -> None:
        with pytest.raises(ValidationError), host_lookups.shared_deadline(BUDGET, 16) as checks:
            for index in range(16):
                checks.add(allow, f"l{number}-{index}.slow.test", 80, "url", socket.getaddrinfo)

    with ThreadPoolExecutor(6) as launches:
        list(launches.map(launch, range(6)))
    lookups = [thread for thread in threading.enumerate() if thread.name == "launch-lookup"]
    assert 0 < len(lookups) <= host_lookups.POOL_THREADS


# --- the three ways a workflow is checked hold a thread no longer than the budget ---------


def test_a_launch_holds_its_thread_no_longer_than_the_budget(names: Names, fast: Settings) -> None:
    names.stuck = True
    orch = Orchestrator(fast, RecordingDispatcher())
    elapsed, refused = timed(lambda: orch.launch(many_hosts(12), owner="owner-1"))
    assert isinstance(refused, ValidationError), refused
    assert elapsed < BUDGET + SLACK, elapsed
    assert orch.list(owner="owner-1") == []


def test_registering_a_workflow_over_http_holds_its_thread_no_longer_than_the_budget(
    names: Names, fast: Settings
) -> None:
    names.stuck = True
    orch = Orchestrator(fast, RecordingDispatcher())
    with session_scope(fast.database_url) as session:
        token = tokens.create(session, "owner-1", "t", now=T0)
    client = TestClient(create_app(orch), headers={"Authorization": f"Bearer {token}"})
    # A first request imports what the routes use: not the checks' time (seconds under load).
    assert client.post("/workflows", json={}).status_code == 400
    elapsed, reply = timed(lambda: client.post("/workflows", json=many_hosts(12)))
    assert elapsed < BUDGET + SLACK, elapsed
    assert reply.status_code == 400, reply.text
    assert "ORCH_LAUNCH_CHECK_SECONDS" in reply.text


def test_a_schedule_fire_holds_its_thread_no_longer_than_the_budget(
    names: Names, fast: Settings
) -> None:
    orch = Orchestrator(fast, RecordingDispatcher())
    data = many_hosts(12, name="nightly", schedule={"every": 10})
    orch.transact(
        lambda session: Done(registry.register(session, fast, "owner-1", data, T0, shared=False))
    )
    names.stuck = True  # the names answered at registration; now they do not
    elapsed, report = timed(lambda: schedules.fire(orch.transact, fast, T0 + timedelta(seconds=10)))
    assert elapsed < BUDGET + SLACK, elapsed
    assert report["failed"] == 1, report
    with session_scope(fast.database_url) as session:
        (fire,) = session.scalars(select(ScheduleFire)).all()
        assert fire.reason is not None and "ORCH_LAUNCH_CHECK_SECONDS" in fire.reason
