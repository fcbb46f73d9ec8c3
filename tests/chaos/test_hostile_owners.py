"""The chaos suite's hostile owners, piece by piece, against the real http provider on
loopback (seconds; the whole population runs in ``test_chaos_ci.py``).

Each hostile agent does what it is for (a call to the drip or 102 server is cut at the bound
and raises an outage; the oversized one reports an output over ``ORCH_MAX_OUTPUT_BYTES``; the
echo one sends the bound secret back), the secret binding keeps the secret from every server
but its own, and the plan puts the fan-outs exactly at, and one over, ``ORCH_MAX_BRANCHES``.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.hostile import (
    AGENTS_OWNER,
    FANOUT_OWNER,
    REFUSED,
    SECRET_NAME,
    HostileAgents,
    HostileSizes,
    is_plain,
    plan_hostile,
    sized,
)
from chaos.latency import comparison
from orchestration.core.db import upgrade
from orchestration.core.errors import RetryableProviderError, ValidationError
from orchestration.core.settings import Settings
from orchestration.providers.base import ProviderStatus, TurnRef, TurnRequest
from orchestration.providers.http import HttpProvider
from orchestration.service import Orchestrator

pytestmark = pytest.mark.integration

BOUND = 1.5
#: The test's own threads on two shared cores.
MARGIN = 1.5
MAX_OUTPUT = 65536
SIZES = HostileSizes(agent_runs=2, storm_schedules=3, fanouts=2, branches=7, owner_runs=40)


@pytest.fixture
def agents(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileAgents]:
    hostile = HostileAgents(MAX_OUTPUT + 1024)
    hostile.start()
    try:
        for name, value in hostile.env().items():
            monkeypatch.setenv(name, value)
        yield hostile
    finally:
        hostile.stop()


def _settings(agents: HostileAgents) -> Settings:
    return Settings(
        provider_timeout=BOUND,
        provider_hosts="127.0.0.0/8",
        max_output_bytes=MAX_OUTPUT,
        provider_secrets=os.environ["ORCH_PROVIDER_SECRETS"],
    )


def _turn(options: dict[str, Any], key: str = "run-1:s1:1") -> TurnRequest:
    return TurnRequest(key, "run-1", "s1", 1, "hello", options)


@pytest.mark.parametrize("kind", ["drip", "processing"])
def test_a_server_that_never_answers_costs_one_bounded_call(
    agents: HostileAgents, kind: str
) -> None:
    provider = HttpProvider(_settings(agents))
    began = time.monotonic()
    with pytest.raises(RetryableProviderError):
        provider.start(_turn(agents.agents[kind].options()))
    elapsed = time.monotonic() - began
    print(f"{kind}: call cut after {elapsed:.2f}s (bound {BOUND}s)")
    assert elapsed < BOUND + MARGIN
    assert agents.agents[kind].requests() == 1


def test_the_oversized_agent_reports_an_output_over_the_limit(agents: HostileAgents) -> None:
    provider = HttpProvider(_settings(agents))
    options = agents.agents["oversized"].options()
    run_id = provider.start(_turn(options))
    observed = provider.status(TurnRef("run-1:s1:1", run_id, options))
    assert observed.status is ProviderStatus.COMPLETED
    assert isinstance(observed.output, str) and len(observed.output) > MAX_OUTPUT


def test_the_secret_reaches_its_bound_server_only(agents: HostileAgents) -> None:
    settings = _settings(agents)
    provider = HttpProvider(settings)
    echo = agents.agents["echo"].options(SECRET_NAME)
    provider.validate(echo)
    run_id = provider.start(_turn(echo))
    observed = provider.status(TurnRef("run-1:s1:1", run_id, echo))
    assert agents.secret in str(observed.output), "the echo agent sends the secret back"
    for kind in ("drip", "processing", "oversized"):
        with pytest.raises(ValidationError, match=SECRET_NAME):
            provider.validate(agents.agents[kind].options(SECRET_NAME))
        provider_options = agents.agents[kind].options()
        with contextlib.suppress(RetryableProviderError):  # drip and processing never answer
            provider.start(_turn(provider_options, key=f"run-1:{kind}:1"))
    figures = agents.figures()
    assert figures["secrets_seen_by_bound_server"] == 2
    assert figures["secrets_seen_by_hostile_servers"] == 0
    assert figures["hostile_server_requests"] == {
        "drip": 1,
        "processing": 1,
        "oversized": 1,
        "echo": 2,
    }


def test_the_hostile_plan_sits_at_the_budgets(agents: HostileAgents) -> None:
    settings = _settings(agents)
    plans = plan_hostile(random.Random(5), SIZES, settings, window=30.0)
    assert not any(is_plain(plan.owner) for plan in plans)
    fanouts = [plan for plan in plans if plan.owner == FANOUT_OWNER]
    widths = sorted(len(plan.workflow["steps"][0]["for_each"]) for plan in fanouts)
    assert widths == [SIZES.branches] * SIZES.fanouts + [SIZES.branches + 1] * SIZES.fanouts
    refused = [plan for plan in plans if plan.expect == REFUSED]
    assert {plan.scenario for plan in refused} == {
        "hostile_misbound_secret",
        "hostile_fanout_over_budget",
    }
    assert sum(1 for plan in plans if plan.scenario == "hostile_echo") == SIZES.agent_runs


def test_the_hostile_agents_launch_through_the_registry_and_the_misbound_one_is_refused(
    agents: HostileAgents, tmp_path: Path
) -> None:
    """Raw URLs are refused by default (``ORCH_ALLOW_RAW_URLS``): the hostile agents are the
    operator's registered agents, so every planned launch but the refused ones is written."""
    settings = _settings(agents).model_copy(
        update={"database_url": f"sqlite:///{tmp_path / 'hostile.db'}"}
    )
    upgrade(settings.database_url)
    agents.register(settings)
    orch = Orchestrator(settings, None)
    plans = [
        plan
        for plan in plan_hostile(random.Random(5), SIZES, settings, window=30.0)
        if plan.owner == AGENTS_OWNER
    ]
    refused = {}
    for plan in plans:
        try:
            orch.launch(plan.workflow, owner=plan.owner, request_id=plan.label)
        except ValidationError as exc:
            refused[plan.label] = str(exc)
    planned = {plan.label for plan in plans if plan.expect == REFUSED}
    assert set(refused) == planned and planned, refused
    assert all("headers" in reason for reason in refused.values())


def test_hostile_sizes_are_set_by_name_and_a_wrong_name_is_refused() -> None:
    raised = sized(SIZES, "storm_schedules=100, owner_runs=20")
    assert (raised.storm_schedules, raised.owner_runs, raised.branches) == (100, 20, 7)
    assert raised.settings()["ORCH_MAX_ACTIVE_RUNS_PER_OWNER"] == "20"
    with pytest.raises(ValueError, match="'storm' is not one of agent_runs"):
        sized(SIZES, "storm=3")
    with pytest.raises(ValueError, match="branches='-1' is not a count"):
        sized(SIZES, "branches=-1")


def test_the_latency_comparison_gives_each_percentile_ratio() -> None:
    alone = {"n": 70, "p50": 0.04, "p90": 1.5, "p99": 8.0}
    beside = {"n": 72, "p50": 0.2, "p90": 3.0, "p99": 6.0}
    found = comparison(alone, beside)
    assert (found["p50_ratio"], found["p90_ratio"], found["p99_ratio"]) == (5.0, 2.0, 0.75)
    assert comparison({**alone, "p50": 0.0}, beside)["p50_ratio"] is None
