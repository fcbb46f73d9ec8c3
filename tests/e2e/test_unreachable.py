"""A broker or a database that is not there, as a newcomer meets it (issue 33).

* A launch the broker does not take says so in one line (the broker's address, password
  masked, the cause, the saved run), the CLI exits 3, the Python API raises
  ``BrokerUnavailable`` carrying the run's id and the HTTP API answers 503 with it, all
  within a second; the sweeper then sends the run once the broker is back.
* ``health`` names the address and the cause.
* ``worker`` and ``beat`` on a database that is missing, unreachable or behind, or on an
  unreachable broker, print one line and exit 2, and take no task.

Unreachable brokers are loopback ports: a closed one (refused at once) and a listener whose
accept queue is full (the kernel drops the connection's SYN, as a firewall does).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestration.core.db import upgrade
from orchestration.core.errors import BrokerUnavailable
from orchestration.runtime import broker_probe
from orchestration.runtime.celery_config import STEP_TASK
from orchestration.runtime.celery_queue import client_app, client_executor, client_queue
from orchestration.runtime.processes import ManagedProcess, celery_argv
from orchestration.service import Orchestrator
from orchestration.surfaces.api.app import create_app
from orchestration.upkeep.sweeper import Sweeper
from orchestration.workflows import load_file
from tests.conftest import wait_for
from tests.e2e.conftest import make_token
from tests.e2e.test_cli import CLI, EXAMPLES
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

RESEARCH = load_file(EXAMPLES / "research.yaml")


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A loopback port whose listener never accepts and whose accept queue is full: a new
    connection's SYN is dropped, so a connect waits for its timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.3)
    yield port
    for filler in fillers:
        filler.close()
    listener.close()


def elsewhere(stack: Stack, **values: Any) -> Orchestrator:
    """The stack's orchestrator with other settings (another broker, another queue)."""
    settings = stack.settings.model_copy(update=values)
    return Orchestrator(settings, client_queue(settings))


def cli(
    stack: Stack, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        env={**stack.env, "COLUMNS": "80", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_cli_launch_the_broker_does_not_take_is_one_line_and_exit_3(stack: Stack) -> None:
    port = closed_port()
    broker = f"redis://:s3cret@127.0.0.1:{port}/0"
    owner = f"o-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    result = cli(
        stack,
        "launch",
        str(EXAMPLES / "research.yaml"),
        "--args",
        '{"topic": "x"}',
        ORCH_BROKER_URL=broker,
        ORCH_OWNER=owner,
    )
    took = time.monotonic() - started
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert f"the broker at redis://:**@127.0.0.1:{port}/0 is unreachable" in line, line
    assert "s3cret" not in line and "Connection refused" in line, line
    assert "is saved and will be sent when the broker is back" in line, line
    run_id = line.split("; run ")[1].split()[0]
    saved = stack.orchestrator().get(run_id, owner=owner)
    assert (saved.status, saved.workflow_name) == ("queued", "research")
    as_json = cli(
        stack,
        "launch",
        str(EXAMPLES / "research.yaml"),
        "--args",
        '{"topic": "y"}',
        "--json",
        ORCH_BROKER_URL=broker,
        ORCH_OWNER=owner,
    )
    assert as_json.returncode == 3 and as_json.stdout == ""
    error = json.loads(as_json.stderr)["error"]
    assert error["code"] == "broker_unavailable" and len(error["run_id"]) == 32
    assert error["broker"] == f"redis://:**@127.0.0.1:{port}/0"
    assert took < 10, f"the whole command (Python start-up included) took {took:.1f}s"


#: A broker URL on a port, with a password the error must mask, per transport.
BROKERS = {"redis": "redis://:pw@127.0.0.1:{port}/0", "amqp": "amqp://guest:pw@127.0.0.1:{port}//"}


@pytest.mark.parametrize("how", ["refused", "silent"])
@pytest.mark.parametrize("transport", sorted(BROKERS))
def test_the_python_api_raises_within_a_second_with_the_saved_run(
    stack: Stack, silent_port: int, how: str, transport: str
) -> None:
    port = closed_port() if how == "refused" else silent_port
    down = elsewhere(stack, broker_url=BROKERS[transport].format(port=port))
    owner = f"o-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    with pytest.raises(BrokerUnavailable) as raised:
        down.launch(RESEARCH, {"topic": "x"}, owner=owner, request_id="r-1")
    took = time.perf_counter() - started
    assert took < 1.0, f"{transport} {how}: {took:.2f}s"
    assert raised.value.broker == BROKERS[transport].format(port=port).replace(":pw@", ":**@")
    assert raised.value.run_id is not None
    assert down.get(raised.value.run_id, owner=owner).status == "queued"


def test_the_sweeper_sends_a_run_the_broker_did_not_take(
    stack: Stack, worker: ManagedProcess
) -> None:
    down = elsewhere(stack, broker_url=f"redis://127.0.0.1:{closed_port()}/0")
    owner = f"o-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BrokerUnavailable) as raised:
        down.launch(RESEARCH, {"topic": "x"}, owner=owner, request_id="again")
    run_id = raised.value.run_id
    assert run_id is not None
    up = stack.orchestrator()
    # The same request, once the broker is back, is the same run (nothing launched twice).
    assert up.launch(RESEARCH, {"topic": "x"}, owner=owner, request_id="again").id == run_id
    sweeper = Sweeper(stack.settings, client_executor(stack.settings))

    def swept_and_done() -> bool:
        sweeper.sweep()
        return up.get(run_id, owner=owner).status == "completed"

    wait_for(swept_and_done, stack.settings.heartbeat_timeout + 45, interval=1, what="sent")
    done = up.get(run_id, owner=owner)
    assert done.rearms == 1 and done.result == "Three facts, summarized."


def test_the_http_api_answers_503_with_the_saved_run(stack: Stack) -> None:
    down = elsewhere(stack, broker_url=f"redis://127.0.0.1:{closed_port()}/0")
    owner = f"o-{uuid.uuid4().hex[:8]}"
    client = TestClient(create_app(down))
    answer = client.post(
        "/runs",
        json={"workflow": RESEARCH, "args": {"topic": "x"}},
        headers={"Authorization": f"Bearer {make_token(stack, owner)}"},
    )
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "broker_unavailable" and "is saved" in error["message"]
    assert down.get(error["run_id"], owner=owner).status == "queued"


def test_health_names_the_address_and_the_cause(stack: Stack) -> None:
    port = closed_port()
    result = cli(
        stack,
        "health",
        ORCH_BROKER_URL=f"redis://:s3cret@127.0.0.1:{port}/0",
        ORCH_DATABASE_URL="postgresql://postgres:pw@127.0.0.1:1/nowhere",
    )
    assert result.returncode == 1
    said = " ".join(result.stdout.split())
    assert f"the broker at redis://:**@127.0.0.1:{port}/0 is unreachable" in said, said
    assert "Connection refused" in said and "s3cret" not in said
    assert "the database at postgresql://postgres:***@127.0.0.1:1/nowhere" in said, said
    assert "database FAIL" in said and "broker FAIL" in said


def _queued_message(stack: Stack, queue: str) -> None:
    """One step task waiting in ``queue`` (for a run that does not exist)."""
    client_app(stack.settings).send_task(STEP_TASK, args=("nothing", 0), queue=queue)
    settings = stack.settings.model_copy(update={"queue": queue})
    wait_for(lambda: broker_probe.queue_depth(settings) == 1, 10, what="the message queued")


def _refused(result: subprocess.CompletedProcess[str], process: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    refusals = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(refusals) == 1, result.stderr
    assert refusals[0].startswith(f"error: {process} not started: "), refusals[0]
    return refusals[0]


@pytest.mark.parametrize("start", ["orchestration", "celery"])
def test_a_worker_on_a_database_it_cannot_use_takes_nothing_and_exits_2(
    stack: Stack, tmp_path: Path, start: str
) -> None:
    queue = f"q-refuse-{uuid.uuid4().hex[:8]}"
    _queued_message(stack, queue)
    behind = f"sqlite:///{tmp_path / 'behind.db'}"
    upgrade(behind, "0001")
    cases = {
        "missing": f"sqlite:///{tmp_path / 'none' / 'missing.db'}",
        "unreachable": "postgresql://postgres@127.0.0.1:1/nowhere",
        "behind": behind,
    }
    said = {}
    for case, url in cases.items():
        argv = [CLI, "worker"] if start == "orchestration" else celery_argv("worker")
        result = subprocess.run(
            [*argv, "-Q", queue, "-c", "1"],
            env={**stack.env, "ORCH_DATABASE_URL": url, "ORCH_QUEUE": queue},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        said[case] = _refused(result, "worker")
    assert "no database at" in said["missing"] and not (tmp_path / "none").exists()
    assert "127.0.0.1:1/nowhere is unreachable" in said["unreachable"]
    assert "is at revision 0001" in said["behind"] and "db upgrade" in said["behind"]
    settings = stack.settings.model_copy(update={"queue": queue})
    assert broker_probe.queue_depth(settings) == 1, "a refused worker took a task"


def test_worker_and_beat_on_an_unreachable_broker_exit_2(stack: Stack, tmp_path: Path) -> None:
    broker = f"redis://127.0.0.1:{closed_port()}/0"
    for process in ("worker", "beat"):
        extra = ["-s", str(tmp_path / "schedule")] if process == "beat" else []
        result = cli(stack, process, *extra, ORCH_BROKER_URL=broker)
        line = _refused(result, process)
        assert f"the broker at {broker} is unreachable" in line, line
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    beat = cli(stack, "beat", "-s", str(tmp_path / "schedule"), ORCH_DATABASE_URL=missing)
    assert "no database at" in _refused(beat, "beat")
