"""The chaos suite's CI profile (``python -m chaos --profile ci``), once per broker.

Each leg runs the whole suite in a subprocess, as a developer would, against PostgreSQL
(``ORCH_TEST_DATABASE_URL``) and one broker:

* Redis: the suite starts its *own* ``redis-server`` on a free port (so it may kill and restart
  it without touching the shared one); ``ORCH_TEST_BROKER_URL`` selects the leg, and is used
  as the broker itself only where ``redis-server`` is not installed (the restart fault is then
  skipped and reported as such).
* RabbitMQ (``ORCH_TEST_AMQP_URL``): the suite creates its own virtual host on that node.
  RabbitMQ closes a channel whose delivery stays unacknowledged past ``consumer_timeout``
  (30 minutes by default); a countdown is held unacknowledged by the worker until it is due,
  and chaos countdowns are at most 2 s, so the default is far away (see docs/reliability.md).

Both legs launch the CI profile's hostile owners beside the plain ones (``chaos.hostile``:
agents that drip, answer 102 for ever, send an oversized output or echo the secret; a schedule
storm; a fan-out at ``ORCH_MAX_BRANCHES``), and check that they did their worst.

Both legs include the partition faults (``chaos.partitions``: a worker and the beat in a network
namespace, their link cut, cut one way, slowed) where the machine allows namespaces; where it
does not, the report says why and the leg asserts that each was skipped with that reason.

Locally a leg is skipped when its variables are missing; with ``CI=true`` it fails instead.
The seed is fixed (``CHAOS_SEED`` overrides it) so that a failure is reproducible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.netns import probe
from chaos.partitions import PARTITION_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"
SEED = int(os.environ.get("CHAOS_SEED", "20261130"))
#: The CI profile's own limit is 300 s; this only catches a run that hangs outright.
SUBPROCESS_TIMEOUT = 420


def _require(*names: str) -> dict[str, str]:
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        message = f"{', '.join(missing)} not set: the chaos suite needs real services"
        if IN_CI:
            pytest.fail(f"CI=true but {message}")
        pytest.skip(f"{message} (set them, as .ci/run does, to run this leg)")
    return {name: os.environ[name] for name in names}


def _broker(leg: str) -> tuple[str, str]:
    if leg == "redis":
        env = _require("ORCH_TEST_BROKER_URL", "ORCH_TEST_DATABASE_URL")
        broker = "own-redis" if shutil.which("redis-server") else env["ORCH_TEST_BROKER_URL"]
    else:
        env = _require("ORCH_TEST_AMQP_URL", "ORCH_TEST_DATABASE_URL")
        broker = env["ORCH_TEST_AMQP_URL"]
    return broker, env["ORCH_TEST_DATABASE_URL"]


def _explain(report: dict[str, Any]) -> str:
    lines = [f"reproduce: {report['reproduce']}"]
    for violation in report["violations"][:8]:
        lines.append(f"- {violation['figure']}: run {violation['run_id']} {violation['detail']}")
        lines.extend(f"    {row}" for row in violation.get("journal", [])[-8:])
    return "\n".join(lines)


@pytest.mark.parametrize("leg", ["redis", "rabbitmq"])
def test_ci_profile_keeps_every_promise(leg: str, tmp_path: Path) -> None:
    broker, database = _broker(leg)
    report_path = tmp_path / "chaos-report.json"
    command = [
        sys.executable,
        "-m",
        "chaos",
        "--profile",
        "ci",
        "--seed",
        str(SEED),
        "--broker",
        broker,
        "--database",
        database,
        "--report",
        str(report_path),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT
    )
    print(done.stdout)
    print(done.stderr[-3000:], file=sys.stderr)
    assert report_path.exists(), f"the chaos run did not complete (exit {done.returncode})"
    report = json.loads(report_path.read_text())
    figures = report["figures"]
    assert figures["runs_launched"] >= 40, "the population did not launch"
    nonzero = {name: figures[name] for name in report["must_be_zero"] if figures[name]}
    assert not nonzero, f"must-be-zero figures are not 0: {nonzero}\n{_explain(report)}"
    assert done.returncode == 0
    _check_partitions(report)
    _check_hostile(report)


def _check_partitions(report: dict[str, Any]) -> None:
    """Where namespaces work, the beat and the slow link struck, and a worker was cut off
    while it held a step (both ways or one way: either needs a step on the namespaced worker);
    where they do not, each kind was skipped, saying why."""
    reason = probe()
    kinds = {kind: report["faults"].get(kind, {}) for kind in PARTITION_KINDS}
    if reason is not None:
        print(f"partition faults SKIPPED: {reason}")
        assert report["partitions"]["available"] is False
        skipped = [f for f in report["fault_log"] if f["kind"] in PARTITION_KINDS]
        assert skipped and all(f["detail"].startswith("skipped: ") for f in skipped)
        return
    assert report["partitions"]["available"] is True
    struck = {kind for kind, data in kinds.items() if data.get("injected")}
    assert {"beat_cut", "net_slow"} <= struck, f"struck only {struck}: {report['fault_log']}"
    assert struck & {"net_cut", "net_oneway"}, f"no worker was cut off: {report['fault_log']}"


def _check_hostile(report: dict[str, Any]) -> None:
    """The hostile owners were there and did their worst: every hostile server was called,
    the echo agent (the secret's bound host) saw the secret, the misbound secret and the
    fan-out one over budget were refused, the fan-out at budget ran all its branches, and the
    storm's schedules fired."""
    hostile, figures = report["hostile"], report["figures"]
    assert hostile["on"] is True
    assert all(server["requests"] > 0 for server in hostile["servers"]), hostile["servers"]
    assert figures["secrets_seen_by_bound_server"] > 0
    assert figures["launches_refused"] >= 2 and figures["plain_launches_refused"] == 0
    branches = report["outcomes"]["by_scenario"].get("hostile_fanout_at_budget (branch runs)")
    assert (
        sum((branches or {}).values()) == hostile["sizes"]["branches"] * hostile["sizes"]["fanouts"]
    )
    assert hostile["storm"]["registered"] > 0 and figures["scheduled_runs"] > 0
    assert figures["worker_rss_samples"] > 0
