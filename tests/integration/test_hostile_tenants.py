"""Hostile providers through the whole engine (issue 10): real raw-socket servers on
127.0.0.1 that the tests start, a real prefork worker and beat, and the run's own rows.

Each server breaks HTTP in one way (``tests/support/hostile_servers.py``): it floods
``102 Processing``, trickles a byte a second, never ends its body, answers 50 MB, or echoes
every request header (the bearer secret among them) into its error body. Against each, the
run ends by the ``deadline_at`` it stated with a clear ``stop_reason``; ``cancel`` returns
within ``cancellation.stated_bound``; the sweeper's passes stay short; another owner's run
completes on time; the worker's memory stays bounded; and the secret appears in no row,
event, ``explain``, API answer or log. URLs outside ``ORCH_PROVIDER_HOSTS`` and secrets not
bound to a URL's host are refused at launch, with no row written and no connection made.

Connect-time refusal (a name that resolves elsewhere at call time than at launch) is proven
at the Exchange level with an injected resolver in ``test_bounded_calls.py``
(``test_dns_rebinding_is_refused_before_connecting``); it is not repeated here.

Figures (cancel latency, sweeper pass seconds, the scripted run's completion time, the
worker's peak memory) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, inspect, select, text

from orchestration.core import deadlines
from orchestration.core.db import get_engine, session_scope, utcnow
from orchestration.core.errors import ValidationError
from orchestration.core.models import Run, RunEvent, Step
from orchestration.core.states import RUN_TERMINAL, RunStatus
from orchestration.providers.exchange import MAX_RESPONSE_BYTES
from orchestration.reads.records import RunRecord
from orchestration.runs import cancellation
from orchestration.runtime.liveness import last_pass
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.workflows import parsing
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.support.hostile_servers import (
    Behaviour,
    Conversation,
    HostileServer,
    echo_headers,
    endless_chunked,
    huge_body,
    processing_flood,
    trickle_body,
    trickle_head,
    well_behaved,
)

pytestmark = pytest.mark.integration

#: The bearer secret: only the worker's environment holds it, under ``TOKEN_ENV``.
SECRET = "h0stile-tenant-token-5e7d41"
TOKEN_ENV = "HOSTILE_TENANT_TOKEN"
#: A declared secret bound to a host that no URL here names.
ELSEWHERE_ENV = "ELSEWHERE_TOKEN"
STACK_SETTINGS = {
    "ORCH_PROVIDER_TIMEOUT": "2",
    "ORCH_CANCEL_CALL_TIMEOUT": "1",
    # The inline attempt of ``cancel`` plus one ``stop_turn`` attempt: a hanging cancel
    # endpoint is given up on within seconds, not the default minute.
    "ORCH_STOP_ATTEMPTS": "2",
    "ORCH_PROVIDER_HOSTS": "127.0.0.1,::1,localhost",
    "ORCH_PROVIDER_SECRETS": json.dumps(
        {TOKEN_ENV: ["127.0.0.1"], ELSEWHERE_ENV: ["agents.example.com:443"]}
    ),
    TOKEN_ENV: SECRET,
}
#: Prefork children: hostile calls hold one each for up to ``ORCH_PROVIDER_TIMEOUT``.
CONCURRENCY = 4
#: Timestamps are written by processes on this machine's one clock: only its resolution.
RESOLUTION = timedelta(milliseconds=10)
#: The worker, its children included, stays under this (bytes).
MEMORY_BOUND = 1 << 30
#: Figures printed at the end of the module (``-s``).
FIGURES: dict[str, str] = {}
#: Seconds between each test-1 run's end and the last deadline it stated.
SLACK_LEFT: dict[str, float] = {}

AUTH = {"Authorization": {"secret": TOKEN_ENV, "prefix": "Bearer "}}
#: A prompt answer naming turn ``turn-1``, working: for start and status alike.
WORKING = well_behaved({"id": "turn-1", "state": "working"})
CANCEL_OK = well_behaved({"cancelled": True})

#: Each hostile behaviour: how to make it, and the outcome it must come to. An outage (no
#: answer in time, a 5xx) parks the run until its budget ends it; a refusal fails it.
OUTAGE = ("timed_out", "park_expired")
REFUSAL = ("failed", "step_failed")
PROVIDER_TIMEOUT = float(STACK_SETTINGS["ORCH_PROVIDER_TIMEOUT"])
#: A call's stated bound is what is left of its window: a start's window began at its claim,
#: so under load it says a little less than ``ORCH_PROVIDER_TIMEOUT`` (1.99 s), never more.
TIMED_OUT_CALL = r"no answer within (?P<bound>\d+(\.\d+)?)s"


@dataclass(frozen=True)
class Hostility:
    make: Callable[[], Behaviour]
    outcome: tuple[str, str]
    #: What the step's error says about the provider (a regular expression).
    says: str


HOSTILE: dict[str, Hostility] = {
    "102-flood": Hostility(processing_flood, OUTAGE, TIMED_OUT_CALL),
    "trickle-head": Hostility(trickle_head, OUTAGE, TIMED_OUT_CALL),
    "trickle-body": Hostility(trickle_body, OUTAGE, TIMED_OUT_CALL),
    "endless-chunked": Hostility(endless_chunked, OUTAGE, TIMED_OUT_CALL),
    "50MB-announced": Hostility(huge_body, REFUSAL, f"B announced, over {MAX_RESPONSE_BYTES} B"),
    "50MB-unannounced": Hostility(
        lambda: huge_body(announce=False), REFUSAL, f"answer over {MAX_RESPONSE_BYTES} B"
    ),
    "echo-headers": Hostility(echo_headers, OUTAGE, "answered 500"),
}
#: One server per behaviour of the issue, for the runs that are live together.
FIVE = ("102-flood", "trickle-body", "endless-chunked", "50MB-unannounced", "echo-headers")


def routed(start: Behaviour, status: Behaviour, cancel: Behaviour) -> Behaviour:
    """One behaviour per endpoint: ``POST …/cancel``, other ``POST`` (start), ``GET``."""

    def play(talk: Conversation) -> None:
        request = talk.request
        if request.method == "POST" and request.target.rstrip("/").endswith("/cancel"):
            cancel(talk)
        elif request.method == "POST":
            start(talk)
        else:
            status(talk)

    return play


def first_then(first: Behaviour, then: Behaviour) -> Behaviour:
    """``first`` for the first connection, ``then`` for every later one."""
    lock = threading.Lock()
    calls = [0]

    def play(talk: Conversation) -> None:
        with lock:
            calls[0] += 1
            mine = calls[0]
        (first if mine == 1 else then)(talk)

    return play


#: How a test-1 case is served: every endpoint hostile, or a good start then hostile
#: status and cancel (so the hostility meets a turn that is running).
VARIANTS: dict[str, Callable[[Behaviour, Behaviour, Behaviour], Behaviour]] = {
    "all-hostile": lambda a, b, c: routed(a, b, c),
    "good-start": lambda a, b, c: routed(WORKING, b, c),
}


def flow(url: str, *, by_key: bool = False, headers: Any = None) -> dict[str, Any]:
    """A one-step http workflow on ``url``; ``by_key`` addresses status and cancel by the
    turn key, so they reach a turn whose start never answered."""
    turn = "{key}" if by_key else "{run_id}"
    return {
        "name": "hostile",
        "steps": [
            {
                "id": "s1",
                "provider": "http",
                "task": "hello",
                "timeout": 60,
                "poll_interval": 0.2,
                "max_poll_interval": 1.0,
                "with": {
                    "start": {"url": f"{url}/runs"},
                    "status": {"url": f"{url}/runs/{turn}"},
                    "cancel": {"url": f"{url}/runs/{turn}/cancel"},
                    "headers": AUTH if headers is None else headers,
                    "run_id_path": "id",
                    "status_path": "state",
                    "output_path": "result",
                    "status_map": {"working": "running", "done": "completed"},
                },
            }
        ],
    }


def scripted() -> dict[str, Any]:
    """A plain scripted run: running for 0.3 s, then completed."""
    return {
        "name": "plain",
        "steps": [
            {
                "id": "s1",
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.1,
                "max_poll_interval": 0.5,
                "with": {"states": [["running", 0.3], ["completed"]], "output": {"ok": 1}},
            }
        ],
    }


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _figures() -> Iterator[None]:
    yield
    if SLACK_LEFT:
        tightest = min(SLACK_LEFT, key=SLACK_LEFT.__getitem__)
        FIGURES["test-1 deadline_at minus finished_at, least"] = (
            f"{SLACK_LEFT[tightest]:.2f}s ({tightest})"
        )
    for name, figure in FIGURES.items():
        print(f"hostile tenants | {name}: {figure}")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every connect this process attempts beyond loopback is refused unsent and recorded;
    the test then fails on the record (the worker's provider calls go to 127.0.0.1)."""
    refused: list[Any] = []
    real = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = str(address[0]).split("%")[0]
            if not ipaddress.ip_address(host).is_loopback:
                refused.append(address)
                raise ConnectionRefusedError(f"test refused a connection to {address}")
        real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield refused
    assert refused == [], f"connections beyond loopback were attempted: {refused}"


@pytest.fixture(scope="module")
def worker(stack: Stack) -> ManagedProcess:
    """The module's worker, with ``CONCURRENCY`` children (the secret in its environment)."""
    return stack.start_worker(concurrency=CONCURRENCY)


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], HostileServer]]:
    """Start hostile servers for one test; all are stopped when it ends."""
    with contextlib.ExitStack() as servers:
        yield lambda behaviour: servers.enter_context(HostileServer(behaviour))


# -- helpers -------------------------------------------------------------------------------


@dataclass
class Watched:
    """A run followed until terminal, with the last ``deadline_at`` it stated while live."""

    label: str
    run_id: str
    owner: str
    deadline: datetime | None
    #: Set when a live sighting was already past the deadline it stated: that deadline.
    overdue: datetime | None = None
    overdue_seen: str = ""
    finished_at: datetime | None = None
    seen: list[str] = field(default_factory=list)
    #: (when sighted, status, deadline_at) at each change, for failure messages.
    history: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.finished_at is not None


def launched(orch: Orchestrator, label: str, workflow: dict[str, Any], owner: str) -> Watched:
    record = orch.launch(workflow, owner=owner)
    assert record.deadline_at is not None, "a launched run states its deadline_at"
    return Watched(label, record.id, owner, record.deadline_at, seen=[record.status])


class Watcher:
    """Follows runs from a thread, polling their rows (one query a tick) until all are
    terminal, so a run is watched while the test is still launching others. Each run keeps
    its last live ``deadline_at`` and notes any live sighting past it; ``tick`` runs after
    every poll, in the watcher's thread."""

    def __init__(self, stack: Stack, tick: Callable[[], None] | None = None) -> None:
        self._url = stack.settings.database_url
        self._tick = tick
        self._runs: list[Watched] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def add(self, run: Watched) -> Watched:
        with self._lock:
            self._runs.append(run)
        return run

    def wait(self, timeout: float) -> None:
        """Return once every run added is terminal; fail after ``timeout`` seconds."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if self._failure is not None:
                raise self._failure
            with self._lock:
                if all(run.done for run in self._runs):
                    return
            time.sleep(0.05)
        late = {run.label: run.seen for run in self._runs if not run.done}
        pytest.fail(f"runs not terminal within {timeout}s: {late}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
                if self._tick is not None:
                    self._tick()
            except BaseException as exc:  # handed to ``wait``
                self._failure = exc
                return
            self._stop.wait(0.1)

    def _poll(self) -> None:
        with self._lock:
            live = {run.run_id: run for run in self._runs if not run.done}
        if not live:
            return
        now = utcnow()  # before the read: a row read live was live at or after ``now``
        with session_scope(self._url) as session:
            rows = session.execute(
                select(Run.id, Run.status, Run.deadline_at, Run.finished_at).where(
                    Run.id.in_(list(live))
                )
            ).all()
        for run_id, status, deadline_at, finished_at in rows:
            run = live[run_id]
            if run.seen[-1] != status:
                run.seen.append(status)
            sighting = (status, str(deadline_at))
            if not run.history or run.history[-1][1:] != sighting:
                run.history.append((now.time().isoformat(), *sighting))
            if RunStatus(status) in RUN_TERMINAL:
                run.finished_at = finished_at
                continue
            assert deadline_at is not None, f"{run.label} is live ({status}) with no deadline_at"
            if run.overdue is None and now - deadline_at > RESOLUTION:
                run.overdue = deadline_at
                run.overdue_seen = f"seen live ({status}) at {now.time()}"
            run.deadline = deadline_at


def assert_by_deadline(run: Watched) -> None:
    """The run ended by the last deadline it stated, and was never seen live past one."""
    if run.overdue is not None:
        late = (run.finished_at - run.overdue).total_seconds() if run.finished_at else None
        raise AssertionError(
            f"{run.label} was {run.overdue_seen}, past the deadline_at {run.overdue.time()} it "
            f"had stated, and ended {late:.2f}s after it; history (seen at, status, "
            f"deadline_at) {run.history}"
        )
    assert run.finished_at is not None and run.deadline is not None
    late = (run.finished_at - run.deadline).total_seconds()
    assert run.finished_at <= run.deadline + RESOLUTION, (
        f"{run.label} ended {late:.3f}s after its stated deadline_at {run.deadline}; "
        f"history {run.history}"
    )


def children_of(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def memory_kib(pid: int, key: str) -> int:
    """``key`` (``VmRSS``, ``VmHWM``) of ``/proc/PID/status`` in KiB; 0 once it has gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def worker_memory(worker: ManagedProcess) -> tuple[int, int]:
    """Bytes resident now, and the sum of each live process's peak, over the worker's tree."""
    tree = children_of(worker.pid)
    rss = sum(memory_kib(pid, "VmRSS") for pid in tree)
    peaks = sum(memory_kib(pid, "VmHWM") for pid in tree)
    return rss * 1024, peaks * 1024


def mib(size: float) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def responsive(orch: Orchestrator, owner: str, timeout: float) -> float:
    """Seconds a plain scripted run takes from launch to ``completed``."""
    began = time.monotonic()
    run = orch.launch(scripted(), owner=owner)
    done: RunRecord = wait_for(
        lambda: (
            (r := orch.get(run.id, owner=owner)).status in {s.value for s in RUN_TERMINAL} and r
        ),
        timeout,
        interval=0.1,
        what="the scripted run terminal",
    )
    assert (done.status, done.stop_reason) == ("completed", "completed"), done.error
    return time.monotonic() - began


def row_counts(stack: Stack) -> tuple[int, int, int]:
    with session_scope(stack.settings.database_url) as session:
        return tuple(  # type: ignore[return-value]
            session.scalar(select(func.count()).select_from(table))
            for table in (Run, Step, RunEvent)
        )


def database_text(stack: Stack) -> str:
    """Every row of every table of the stack's database, as text."""
    engine = get_engine(stack.settings.database_url)
    lines: list[str] = []
    with engine.connect() as connection:
        for table in inspect(engine).get_table_names():
            for row in connection.execute(text(f'SELECT * FROM "{table}"')):
                lines.append(f"{table}: {tuple(row)!r}")
    return "\n".join(lines)


# -- 1. every hostile provider ends its run by the stated deadline --------------------------


@dataclass
class Case:
    run: Watched
    server: HostileServer
    record: RunRecord | None = None
    events: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def hostile_cases(
    worker: ManagedProcess, beat: ManagedProcess, stack: Stack, orch: Orchestrator
) -> Iterator[dict[str, Case]]:
    """Every (variant, behaviour) launched at once, then followed until all are terminal."""
    owner = "owner-hostile-cases"
    cases: dict[str, Case] = {}
    launch_seconds: list[float] = []
    with contextlib.ExitStack() as servers, Watcher(stack) as watcher:
        began = time.monotonic()
        for variant, serving in VARIANTS.items():
            for name, hostility in HOSTILE.items():
                label = f"{variant}/{name}"
                behaviour = serving(hostility.make(), hostility.make(), hostility.make())
                server = servers.enter_context(HostileServer(behaviour))
                workflow = flow(server.url, by_key=variant == "all-hostile")
                called = time.monotonic()
                run = watcher.add(launched(orch, label, workflow, owner))
                launch_seconds.append(time.monotonic() - called)
                cases[label] = Case(run, server)
        watcher.wait(90)
        FIGURES[f"{len(cases)} hostile runs, launch to all terminal"] = (
            f"{time.monotonic() - began:.1f}s"
        )
        FIGURES["test-1 launch calls while hostile runs were live"] = (
            f"max {max(launch_seconds):.2f}s, total {sum(launch_seconds):.2f}s"
        )
    for case in cases.values():
        case.record = orch.get(case.run.run_id, owner=owner)
        case.events = [
            f"{e['at'].time()} {e['from']}->{e['to']}: {e['cause']}"
            for e in orch.events(case.run.run_id, owner=owner)
        ]
    yield cases


@pytest.mark.parametrize("behaviour", list(HOSTILE))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_hostile_provider_ends_the_run_by_its_stated_deadline(
    hostile_cases: dict[str, Case], variant: str, behaviour: str
) -> None:
    """Served hostile on every endpoint, or a good start then hostile status and cancel:
    the run is terminal by the last ``deadline_at`` it stated while live, with the stop
    reason of its kind of failure (outage: park expired; refusal: step failed), and the
    step's error says what the provider did. The hostile endpoint was really reached."""
    case = hostile_cases[f"{variant}/{behaviour}"]
    hostility = HOSTILE[behaviour]
    record = case.record
    assert record is not None
    try:
        assert_by_deadline(case.run)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; events {case.events}") from None
    assert (record.status, record.stop_reason) == hostility.outcome, (record.error, case.run.seen)
    step = record.steps[0]
    assert step.status not in ("pending", "running", "parked"), step.status
    assert record.finished_at is not None and case.run.deadline is not None
    assert step.finished_at is not None and step.finished_at <= record.finished_at
    said = re.search(hostility.says, step.error or "")
    assert said is not None, step.error
    if "bound" in said.groupdict():
        assert 0 < float(said["bound"]) <= PROVIDER_TIMEOUT, step.error
    methods = [request.method for request in case.server.requests]
    hostile_method = "POST" if variant == "all-hostile" else "GET"
    assert hostile_method in methods, methods
    left = case.run.deadline - record.finished_at
    SLACK_LEFT[f"{variant}/{behaviour}"] = left.total_seconds()


def test_the_worker_is_still_responsive_after_the_hostile_runs(
    hostile_cases: dict[str, Case], orch: Orchestrator, worker: ManagedProcess, owner: str
) -> None:
    """After every hostile run has ended, the worker process is up and a plain scripted run
    completes promptly: no child is left stuck on a hostile server."""
    assert worker.proc.poll() is None, worker.log()[-3000:]
    elapsed = responsive(orch, owner, timeout=20)
    FIGURES["scripted run after the hostile runs"] = f"{elapsed:.2f}s"
    assert elapsed < 10


# -- 2. cancel while a hostile provider holds the turn --------------------------------------

CANCEL_CASES: dict[str, tuple[Callable[[], Behaviour], bool, str, str]] = {
    # (behaviour, address by key, request in flight when cancelling, final turn_stop status)
    "start hangs, cancel hangs": (
        lambda: routed(processing_flood(), WORKING, processing_flood()),
        True,
        "POST",
        "failed",
    ),
    "status hangs, cancel hangs once": (
        lambda: routed(WORKING, trickle_head(), first_then(processing_flood(), CANCEL_OK)),
        False,
        "GET",
        "stopped",
    ),
}


@pytest.mark.parametrize("case", list(CANCEL_CASES))
def test_cancel_returns_within_its_stated_bound_while_the_provider_hangs(
    case: str,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
    serve: Callable[[Behaviour], HostileServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a call to a hanging provider in flight (a start, which holds the run's row, or
    a status poll), ``cancel`` returns the terminal ``cancelled`` record within
    ``cancellation.stated_bound``; the turn's stop, left ``pending`` by the bounded inline
    attempt, is settled by the ``stop_turn`` task (``failed`` when the cancel endpoint
    always hangs, ``stopped`` when its second call answers). The calling process holds the
    secret here (an API deployed with the worker's environment), so its inline attempt
    reaches the hanging endpoint; the caller without it is the next test."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    make, by_key, in_flight, final = CANCEL_CASES[case]
    server = serve(make())
    run = orch.launch(flow(server.url, by_key=by_key), owner=owner)
    wait_for(
        lambda: any(r.method == in_flight for r in server.requests),
        20,
        what=f"a {in_flight} in flight on the hanging server",
    )
    bound = cancellation.stated_bound(stack.settings)
    began = time.monotonic()
    record = orch.cancel(run.id, owner=owner)
    elapsed = time.monotonic() - began
    FIGURES[f"cancel ({case})"] = f"{elapsed:.2f}s (stated bound {bound:.1f}s)"
    print(f"cancel ({case}): returned in {elapsed:.2f}s, stated bound {bound:.1f}s")
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested"), record.error
    assert elapsed <= bound, f"cancel took {elapsed:.2f}s, over its stated bound {bound}s"

    stop = record.steps[0].turn_stop
    assert stop is not None, "cancel records the turn's stop"
    if final == "failed":
        assert (stop["status"], stop["attempts"]) == ("pending", 1), stop
    else:  # the stop task may already have stopped it by the time the record is read
        assert stop["status"] in ("pending", "stopped") and stop["attempts"] >= 1, stop
    settled = wait_for(
        lambda: (
            (s := orch.get(run.id, owner=owner).steps[0].turn_stop)
            and s["status"] != "pending"
            and s
        ),
        stack.settings.provider_timeout * stack.settings.stop_attempts + 15,
        interval=0.1,
        what="the stop_turn task settles the turn's stop",
    )
    # ``revoke(terminate=True)`` kills only a task its worker has already accepted; a step
    # task it misses honours the cancel at its next execution and makes its own inline
    # attempt, racing this one (whichever closes the run first records its stop). So the
    # endpoint may see one cancel more than the stop's attempts, and a stop that the step's
    # attempt settled has fewer attempts; never more than ``ORCH_STOP_ATTEMPTS``.
    attempts = stack.settings.stop_attempts
    assert settled["status"] == final, settled
    if final == "failed":
        assert settled["attempts"] == attempts, settled
        assert f"gave up after {attempts} attempts" in settled["error"]
    else:
        assert 1 <= settled["attempts"] <= attempts, settled
    cancels = [r for r in server.requests if r.target.endswith("/cancel")]
    assert settled["attempts"] <= len(cancels) <= attempts + 1, [r.target for r in server.requests]
    assert orch.get(run.id, owner=owner).status == "cancelled"


def test_a_cancel_from_a_process_without_the_secret_leaves_the_stop_to_the_worker(
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
    serve: Callable[[Behaviour], HostileServer],
) -> None:
    """The secret is the worker's (docs/providers.md: "the worker reads it at call time");
    a web app calling ``cancel`` does not hold it. Its inline provider cancel cannot be
    made there, so the turn's stop must be left ``pending`` for the ``stop_turn`` task,
    whose worker holds the secret and stops the turn: the provider sees the cancel."""
    assert TOKEN_ENV not in os.environ
    server = serve(routed(WORKING, WORKING, CANCEL_OK))
    run = orch.launch(flow(server.url), owner=owner)
    wait_for(
        lambda: orch.get(run.id, owner=owner).steps[0].last_provider_status == "working",
        20,
        what="the turn is working",
    )
    record = orch.cancel(run.id, owner=owner)
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
    stop = record.steps[0].turn_stop
    cancels = [r.target for r in server.requests if r.target.endswith("/cancel")]
    assert stop is not None and stop["status"] in ("pending", "stopped"), (
        f"the caller's missing secret settled the turn's stop as {stop}; the provider has "
        f"seen {len(cancels)} cancel requests, and the turn is left running"
    )
    wait_for(
        lambda: (orch.get(run.id, owner=owner).steps[0].turn_stop or {}).get("status") == "stopped",
        15,
        interval=0.1,
        what="the worker stops the turn",
    )
    assert [r.target for r in server.requests if r.target.endswith("/cancel")] != []


# -- 3. hostile runs hold up nobody else ----------------------------------------------------


def test_live_hostile_runs_delay_neither_another_owner_nor_the_sweeper_nor_grow_memory(
    worker: ManagedProcess,
    beat: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    serve: Callable[[Behaviour], HostileServer],
) -> None:
    """Five hostile runs live at once (one per behaviour, every endpoint hostile) and
    another owner's scripted run launched alongside: the scripted run completes before its
    stated deadline and within 30 s; every sweeper pass made while hostile runs were live
    takes under 1 s, and passes follow each other within the engine's stated slack; the
    worker's memory (main process and children) stays under ``MEMORY_BOUND``."""
    hostile_owner, other_owner = "owner-hostile-five", "owner-bystander"
    runs: list[Watched] = []
    completed_in: list[float] = []
    passes: dict[int, tuple[float, datetime, int]] = {}
    reports: dict[int, dict[str, Any]] = {}
    peak_rss = [0]

    def tick() -> None:
        if bystander is not None and bystander.done and not completed_in:
            completed_in.append(time.monotonic() - began)
        if runs and not all(run.done for run in runs):
            beat_row = last_pass(stack.settings)
            if beat_row is not None:
                live = int(beat_row.last_report.get("live", 0))
                passes.setdefault(
                    beat_row.passes, (beat_row.last_pass_seconds, beat_row.last_pass_at, live)
                )
                reports.setdefault(beat_row.passes, beat_row.last_report)
        peak_rss[0] = max(peak_rss[0], worker_memory(worker)[0])

    bystander: Watched | None = None
    with Watcher(stack, tick) as watcher:
        for name in FIVE:
            make = HOSTILE[name].make
            server = serve(routed(make(), make(), make()))
            runs.append(
                watcher.add(launched(orch, name, flow(server.url, by_key=True), hostile_owner))
            )
        began = time.monotonic()
        bystander = watcher.add(launched(orch, "scripted", scripted(), other_owner))
        FIGURES["bystander's launch call beside 5 hostile runs"] = (
            f"{time.monotonic() - began:.2f}s"
        )
        watcher.wait(90)

    # The figures first, all of them, then the checks.
    assert bystander is not None
    record = orch.get(bystander.run_id, owner=other_owner)
    assert record.finished_at is not None
    engine_seconds = (record.finished_at - record.created_at).total_seconds()
    FIGURES["scripted run beside 5 hostile runs, launch to completed"] = (
        f"{completed_in[0]:.2f}s observed, {engine_seconds:.2f}s created->finished"
    )
    during = sorted((n, s, at) for n, (s, at, live) in passes.items() if live > 0)
    seconds = [s for _, s, _ in during]
    gaps = [
        (at2 - at1).total_seconds()
        for (n1, _, at1), (n2, _, at2) in itertools.pairwise(during)
        if n2 == n1 + 1
    ]
    slack = deadlines.slack_seconds(stack.settings)
    FIGURES["sweeper pass seconds while 5 hostile runs live"] = (
        f"max {max(seconds, default=0):.4f}s over {len(seconds)} passes seen: "
        + ", ".join(f"{s:.4f}" for s in seconds)
    )
    if during:
        FIGURES["slowest sweeper pass's report"] = json.dumps(
            reports[max(during, key=lambda seen: seen[1])[0]]
        )
    FIGURES["sweeper gap between passes while live"] = (
        f"max {max(gaps, default=0):.2f}s (interval {stack.settings.sweep_interval}s, "
        f"stated slack {slack:.1f}s): " + ", ".join(f"{g:.2f}" for g in gaps)
    )
    _, peaks = worker_memory(worker)
    FIGURES["worker RSS (main + children)"] = (
        f"peak sampled {mib(peak_rss[0])}, sum of per-process VmHWM {mib(peaks)} "
        f"(bound {mib(MEMORY_BOUND)})"
    )

    # The bystander completed, promptly and by its deadline.
    assert (record.status, record.stop_reason) == ("completed", "completed"), record.error
    assert engine_seconds < 30 and completed_in[0] < 30
    assert_by_deadline(bystander)
    # The worker's memory stayed bounded.
    assert peak_rss[0] < MEMORY_BOUND and peaks < MEMORY_BOUND
    # The sweeper kept passing, each pass short, while hostile runs were live.
    assert len(during) >= 3, f"too few sweeper passes seen while hostile runs were live: {passes}"
    slowest = max(during, key=lambda seen: seen[1])
    assert max(seconds) < 1.0, (
        f"a sweeper pass took {max(seconds)}s; its report {reports[slowest[0]]}; {during}"
    )
    assert max(gaps, default=0) <= slack, f"sweeper passes {gaps}s apart (slack {slack}s)"
    # Every hostile run ended by the deadline it stated.
    for run in runs:
        assert_by_deadline(run)


# -- 4. no secret anywhere ------------------------------------------------------------------


def test_an_echoed_secret_appears_in_no_row_event_explain_api_answer_or_log(
    worker: ManagedProcess,
    beat: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
    serve: Callable[[Behaviour], HostileServer],
) -> None:
    """Services that echo every request header (the bearer secret among them) into their
    500s, on start for one run and on status and cancel for another (cancelled while it is
    parked): once both have ended and the stop task has settled, the secret is in no row of
    any table, no event, no ``explain``, no HTTP API answer and no worker or beat log, while
    the errors show the echo with the secret masked."""
    echo_start = serve(routed(echo_headers(), echo_headers(), echo_headers()))
    echo_later = serve(routed(WORKING, echo_headers(), echo_headers()))
    with Watcher(stack) as watcher:
        first = watcher.add(
            launched(orch, "echo on start", flow(echo_start.url, by_key=True), owner)
        )
        second = orch.launch(flow(echo_later.url), owner=owner)
        wait_for(
            lambda: orch.get(second.id, owner=owner).park_reason == "platform_interrupt",
            20,
            what="the status echo parks the run",
        )
        # The caller holds the secret for its inline cancel (see the previous test for one that
        # does not), and only then: the reads below are made without it, so nothing they show
        # can have been masked on the way out.
        with pytest.MonkeyPatch.context() as env:
            env.setenv(TOKEN_ENV, SECRET)
            cancelled = orch.cancel(second.id, owner=owner)
        assert cancelled.status == "cancelled", cancelled.error
        wait_for(
            lambda: (
                (orch.get(second.id, owner=owner).steps[0].turn_stop or {}).get("status")
                == "failed"
            ),
            20,
            what="the stop task gives up on the echoing cancel endpoint",
        )
        watcher.wait(40)
    assert_by_deadline(first)

    # The secret really was sent to every endpoint, and really was echoed back.
    sent = {
        (r.method, r.target.rsplit("/", 1)[-1]): r.headers.get("authorization")
        for r in [
            *echo_start.requests,
            *echo_later.requests,
        ]
    }
    assert set(sent.values()) == {f"Bearer {SECRET}"}, sent
    assert {method for method, _ in sent} == {"POST", "GET"} and ("POST", "cancel") in sent
    ran = orch.get(first.run_id, owner=owner)
    for record in (ran, orch.get(second.id, owner=owner)):
        shown = [record.steps[0].error or "", json.dumps(record.steps[0].turn_stop)]
        assert any("Bearer ***" in text for text in shown), shown

    app = create_app(orch)
    with session_scope(stack.settings.database_url) as session:
        api_token = tokens.create(session, owner, "hostile", now=utcnow())
    client = TestClient(app, headers={"Authorization": f"Bearer {api_token}"})
    places: dict[str, str] = {"database": database_text(stack)}
    for run_id in (first.run_id, second.id):
        places[f"record {run_id}"] = orch.get(run_id, owner=owner).model_dump_json()
        places[f"events {run_id}"] = json.dumps(orch.events(run_id, owner=owner), default=str)
        places[f"explain {run_id}"] = json.dumps(orch.explain(run_id, owner=owner), default=str)
        for path in (f"/runs/{run_id}", f"/runs/{run_id}/events", f"/runs/{run_id}/explain"):
            answer = client.get(path)
            assert answer.status_code == 200, answer.text
            places[f"API {path}"] = answer.text
    places["API /runs"] = client.get("/runs").text
    places["worker log"] = worker.log()
    places["beat log"] = beat.log()
    leaked = [place for place, content in places.items() if SECRET in content]
    assert leaked == [], f"the secret appears in: {leaked}"
    assert TOKEN_ENV in places[f"record {first.run_id}"]  # the variable's name is stored


# -- 5. the allow-list and the secret bindings at launch ------------------------------------

OUTSIDE = {
    "private": "http://10.1.2.3/agent",
    "metadata": "http://169.254.169.254/latest/meta-data",
    "link-local v6": "http://[fe80::1]/agent",
    "public": "http://8.8.8.8/agent",
    "home router": "http://192.168.1.1/agent",
}


@pytest.mark.parametrize("endpoint", ["start", "status", "cancel"])
@pytest.mark.parametrize("where", list(OUTSIDE))
def test_a_url_outside_the_allow_list_is_refused_at_launch_writing_nothing(
    where: str, endpoint: str, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    """A workflow whose start, status or cancel URL is a private, metadata, link-local,
    public or LAN address outside ``ORCH_PROVIDER_HOSTS`` is refused by ``launch`` with a
    ``ValidationError`` naming that URL's field and the setting; no row is written and no
    connection is attempted (the autouse guard would record one)."""
    workflow = flow("http://127.0.0.1:9")
    url = OUTSIDE[where]
    suffix = "/runs" if endpoint == "start" else "/runs/{run_id}"
    workflow["steps"][0]["with"][endpoint]["url"] = url + suffix
    before = row_counts(stack)
    with pytest.raises(ValidationError) as caught:
        orch.launch(workflow, owner=owner)
    assert caught.value.field == f"steps[0].with.{endpoint}.url", caught.value
    assert "ORCH_PROVIDER_HOSTS" in caught.value.problem, caught.value
    assert "is not allowed" in caught.value.problem, caught.value
    assert row_counts(stack) == before


SECRET_REFUSALS = {
    "undeclared": (
        {"Authorization": {"secret": "AWS_SECRET_ACCESS_KEY"}},
        "headers.Authorization.secret",
        "AWS_SECRET_ACCESS_KEY is not declared in ORCH_PROVIDER_SECRETS",
    ),
    "bound elsewhere": (
        {"X-Key": {"secret": ELSEWHERE_ENV, "prefix": "Key "}},
        "headers.X-Key.secret",
        f"{ELSEWHERE_ENV} may be sent only to agents.example.com:443, not to 127.0.0.1:9",
    ),
    "configuration": (
        {"Authorization": {"env": "ORCH_DATABASE_URL"}},
        "headers.Authorization.env",
        "ORCH_DATABASE_URL is configuration, not a secret",
    ),
}


@pytest.mark.parametrize("case", list(SECRET_REFUSALS))
def test_a_secret_not_bound_to_the_urls_host_is_refused_at_launch_writing_nothing(
    case: str, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    """A header naming an undeclared secret, a declared secret bound to another host, or an
    ``ORCH_`` variable is refused by ``launch`` naming the header's field and
    ``ORCH_PROVIDER_SECRETS``' rule; no row is written."""
    headers, field_name, says = SECRET_REFUSALS[case]
    before = row_counts(stack)
    with pytest.raises(ValidationError) as caught:
        orch.launch(flow("http://127.0.0.1:9", headers=headers), owner=owner)
    assert caught.value.field == f"steps[0].with.{field_name}", caught.value
    assert says in caught.value.problem, caught.value
    assert row_counts(stack) == before


def test_the_secret_bound_to_loopback_is_accepted_at_launch(
    stack: Stack, orch: Orchestrator
) -> None:
    """The control for the refusals: the declared secret, to its own host, validates."""
    parsing.parse(flow("http://127.0.0.1:9"), stack.settings)


# -- 6. a port-restricted allow-list, checked at launch -------------------------------------


def test_localhost_on_a_port_the_allow_list_does_not_name_is_refused_at_launch(
    stack: Stack, owner: str
) -> None:
    """With ``ORCH_PROVIDER_HOSTS=localhost:8765``, ``localhost:8765`` validates and
    ``localhost:8766`` is refused at launch naming the field and the setting, with no row
    written (an Orchestrator on a copy of the settings, no worker: the check is the
    launch's own)."""
    settings = stack.settings.model_copy(update={"provider_hosts": "localhost:8765"})
    restricted = Orchestrator(settings, None)
    parsing.parse(flow("http://localhost:8765", headers={}), settings)
    before = row_counts(stack)
    with pytest.raises(ValidationError) as caught:
        restricted.launch(flow("http://localhost:8766", headers={}), owner=owner)
    assert caught.value.field == "steps[0].with.start.url", caught.value
    assert "localhost" in caught.value.problem and "8766" in caught.value.problem
    assert "ORCH_PROVIDER_HOSTS" in caught.value.problem, caught.value
    assert row_counts(stack) == before


# -- 7. what a worker sends: headers, cleartext secrets, the request's bytes ------------------

SMUGGLING = {
    "Host": "attacker-vhost.example",
    "transfer-encoding": "chunked",
    "Content-Length": "0",
    "Proxy-Authorization": "Basic x",
    "Connection": "upgrade",
}


@pytest.mark.parametrize("header", list(SMUGGLING))
def test_a_routing_or_framing_header_beside_the_secret_is_refused_at_launch(
    header: str, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    """The issue sent ``Host: attacker-vhost.example`` beside the bound bearer secret, and
    ``Transfer-Encoding: chunked`` beside httpx's ``Content-Length``: each is refused at
    launch naming the header's field; no row is written and nothing is sent."""
    headers = {**AUTH, header: SMUGGLING[header]}
    before = row_counts(stack)
    with pytest.raises(ValidationError) as caught:
        orch.launch(flow("http://127.0.0.1:9", headers=headers), owner=owner)
    assert caught.value.field == f"steps[0].with.headers.{header}", caught.value
    assert "set by the engine's HTTP client" in caught.value.problem
    assert row_counts(stack) == before


def test_a_secret_bound_to_port_443_is_refused_for_cleartext_http_at_launch(
    stack: Stack, owner: str
) -> None:
    """``ELSEWHERE_TOKEN`` is bound to ``agents.example.com:443``; a workflow naming it for
    ``http://agents.example.com:443/`` is refused (the host is listed by name, so no lookup
    is made and nothing connects: the autouse guard would record it)."""
    settings = stack.settings.model_copy(
        update={"provider_hosts": f"{stack.settings.provider_hosts},agents.example.com:443"}
    )
    headers = {"Authorization": {"secret": ELSEWHERE_ENV, "prefix": "Bearer "}}
    before = row_counts(stack)
    with pytest.raises(ValidationError) as caught:
        Orchestrator(settings, None).launch(
            flow("http://agents.example.com:443", headers=headers), owner=owner
        )
    assert caught.value.field == "steps[0].with.headers.Authorization.secret", caught.value
    assert "over https only" in caught.value.problem
    assert row_counts(stack) == before
    parsing.parse(flow("https://agents.example.com", headers=headers), settings)


def test_a_start_over_the_request_budget_fails_over_limit_in_the_worker_sending_nothing(
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
    serve: Callable[[Behaviour], HostileServer],
) -> None:
    """A start that names ``{task}`` three times (twice in its URL, once in its default
    body) passes the launch (three times the task's bound fits ``ORCH_MAX_REQUEST_BYTES``),
    but percent-encoding makes a 240 KB task of 'é's 720 KB: the worker stops rendering at
    the budget and the run fails ``over_limit`` naming the setting, with no request made to
    the service."""
    server = serve(WORKING)
    workflow = flow(server.url)
    workflow["steps"][0]["task"] = "{{ args.text }}" * 4
    workflow["steps"][0]["with"]["start"]["url"] = server.url + "/runs/{task}/{task}"
    run = orch.launch(workflow, {"text": "é" * 30_000}, owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).status == "failed", 30, what="the failure")
    record = orch.get(run.id, owner=owner)
    assert record.stop_reason == "over_limit", record.error
    assert record.error is not None and "ORCH_MAX_REQUEST_BYTES" in record.error
    assert server.connections == 0
