"""``explain`` never promises what is not running (issue 33): with no beat, it says that no
sweeper pass has run (or none for N intervals) and that beat must run; with no worker on the
run's queue, that no worker consuming it answered; with none on the upkeep queue, that no
sweeper pass runs. The sweeper's part is the same judgement
``/healthz`` makes (``liveness.SweeperLiveness``). This module starts no beat."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from typing import Any

import pytest

from orchestration.runtime.celery_queue import client_executor, client_queue
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.upkeep.sweeper import Sweeper
from orchestration.workflows import load_file
from tests.conftest import wait_for
from tests.e2e.test_cli import CLI, EXAMPLES
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

NO_SWEEPER = "no sweeper pass has run yet: beat must run (`orchestration beat`)"
#: What follows it: the queue beat sends the passes to (chaos finding 12).
UPKEEP = " and a worker must consume queue {!r} (`orchestration worker`)"


def explain(stack: Stack, run_id: str, owner: str, **env: str) -> Any:
    result = subprocess.run(
        [CLI, "explain", run_id, "--json"],
        env={**stack.env, "ORCH_OWNER": owner, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_explain_says_what_is_not_running(stack: Stack, worker: ManagedProcess) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    nobody = f"q-nobody-{uuid.uuid4().hex[:8]}"
    unserved = stack.settings.model_copy(update={"queue": nobody})
    orch = Orchestrator(unserved, client_queue(unserved))
    run = orch.launch(load_file(EXAMPLES / "research.yaml"), {"topic": "x"}, owner=owner)

    queued = explain(stack, run.id, owner, ORCH_QUEUE=nobody)
    assert f"no worker consuming queue {nobody!r} answered" in queued["next"], queued
    assert "only the sweeper enforces" in queued["text"] and NO_SWEEPER in queued["text"]

    live = stack.orchestrator().launch(load_file(EXAMPLES / "endless.yaml"), owner=owner)
    wait_for(
        lambda: stack.orchestrator().get(live.id, owner=owner).steps[0].polls >= 1,
        30,
        what="the served run polling",
    )
    polling = explain(stack, live.id, owner)
    assert "no worker" not in polling["text"], polling
    assert NO_SWEEPER in polling["text"], polling

    stalled = wait_for(
        lambda: (
            (found := explain(stack, run.id, owner, ORCH_QUEUE=nobody))["health"] == "stalled"
            and found
        ),
        stack.settings.heartbeat_timeout + 10,
        interval=1,
        what="the unserved run stalled",
    )
    assert stalled["next"].startswith("the sweeper (every 1s) re-arms it"), stalled
    assert stalled["next"].endswith(f"; but {NO_SWEEPER}{UPKEEP.format(nobody + '.upkeep')}")

    Sweeper(unserved, client_executor(unserved)).sweep()
    time.sleep(4 * stack.settings.sweep_interval)
    late = explain(stack, live.id, owner)
    assert re.search(
        r"no sweeper pass for [4-9] intervals of 1s \(the last \d+s ago\)", late["text"]
    )
    assert "beat must run" in late["text"], late
    Sweeper(stack.settings, client_executor(stack.settings)).sweep()
    # Read in this process at once: a CLI started on a loaded machine can take longer than
    # the intervals that make a pass late.
    fresh = stack.orchestrator().explain(live.id, owner=owner)
    assert "sweeper pass" not in fresh["text"], fresh
    assert "It will be terminal or re-armed by" in fresh["text"], fresh
    # The sweeper passed on time, but no worker consumes the queue of its next pass.
    unswept = stack.settings.model_copy(update={"upkeep_queue": f"{nobody}.upkeep"})
    doubted = Orchestrator(unswept, client_queue(unswept)).explain(live.id, owner=owner)
    assert (
        f"no worker consuming queue '{nobody}.upkeep' answered, so no sweeper pass runs"
        in doubted["text"]
    ), doubted
    stack.orchestrator().cancel(live.id, owner=owner)
