"""Hostile owners beside the plain ones: tenants that use every freedom a workflow gives them
to hurt the fleet, so the audit can show that plain owners keep their promises and their pace.

* **Hostile agents** (``chaos-hostile-agents``): steps naming agents that the operator
  registered (``agents add``, the only way a tenant reaches a host), http services on loopback
  that drip bytes, answer ``102 Processing`` for ever, report an output over
  ``ORCH_MAX_OUTPUT_BYTES``, or echo the request's headers, the secret bound to the echo agent
  included (:mod:`tests.support.hostile_agents`). A step that adds that secret to another
  agent's headers is planned too: its launch must be refused.
* **A schedule storm** (``chaos-hostile-storm``): as many schedules as the owner can register,
  each with the smallest ``every`` allowed, firing all through the launch window.
* **A fan-out at its budget** (``chaos-hostile-fanout``): a ``for_each`` of exactly
  ``ORCH_MAX_BRANCHES`` items at ``ORCH_MAX_BRANCH_CONCURRENCY``, and one item more, refused.

Their sizes are :class:`HostileSizes`, per profile, so that they follow the per-owner budgets
as those grow. The hostile plans come from their own random stream: the plain population of a
seed is the same with and without them.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.population import MAX_STEP_TIMEOUT, RunPlan
from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.service import Orchestrator
from orchestration.workflows import agents as registry
from orchestration.workflows.schedules import MIN_EVERY
from tests.support.hostile_agents import KINDS, HostileAgent

#: Owners of the plain population are ``chaos-owner-N``; hostile ones start with this.
HOSTILE_PREFIX = "chaos-hostile-"
AGENTS_OWNER = f"{HOSTILE_PREFIX}agents"
STORM_OWNER = f"{HOSTILE_PREFIX}storm"
FANOUT_OWNER = f"{HOSTILE_PREFIX}fanout"
#: The secret the echo agent is bound to; no other hostile server may ever see its value.
SECRET_NAME = "CHAOS_ECHO_TOKEN"
#: Scenario names of launches that must be refused (the plan's ``expect``).
REFUSED = "refused"


@dataclass(frozen=True)
class HostileSizes:
    """How much hostility a profile carries, and the per-owner budgets it runs under."""

    #: Runs launched against each hostile agent kind (drip, processing, oversized, echo).
    agent_runs: int
    #: Schedules the storm owner tries to register (it stops at the first refusal).
    storm_schedules: int
    #: Fan-outs at the budget (each of ``branches`` items), and as many one item over it.
    fanouts: int
    #: ``ORCH_MAX_BRANCHES`` of the run: the budget the fan-outs sit at.
    branches: int
    #: ``ORCH_MAX_ACTIVE_RUNS_PER_OWNER`` of the run.
    owner_runs: int

    def settings(self) -> dict[str, str]:
        """The engine settings these sizes run under (the same with hostile owners or not)."""
        return {
            "ORCH_MAX_BRANCHES": str(self.branches),
            "ORCH_MAX_ACTIVE_RUNS_PER_OWNER": str(self.owner_runs),
        }


def sized(sizes: HostileSizes, spec: str) -> HostileSizes:
    """``sizes`` with the fields ``spec`` names (``storm_schedules=100,owner_runs=20``) set;
    raises ``ValueError`` naming a field that is not one, or a value that is not a count."""
    values = asdict(sizes)
    for part in filter(None, (piece.strip() for piece in spec.split(","))):
        name, _, value = part.partition("=")
        if name not in values:
            raise ValueError(f"--hostile-sizes: {name!r} is not one of {', '.join(values)}")
        if not value.isdigit():
            raise ValueError(f"--hostile-sizes: {name}={value!r} is not a count")
        values[name] = int(value)
    return HostileSizes(**values)


def is_plain(owner: str) -> bool:
    """Whether ``owner`` belongs to the plain population."""
    return not owner.startswith(HOSTILE_PREFIX)


@dataclass
class HostileAgents:
    """The hostile services of one chaos run and the secret bound to the echo agent."""

    oversize: int
    agents: dict[str, HostileAgent] = field(default_factory=dict)
    secret: str = field(default_factory=lambda: f"chaos-sk-{uuid.uuid4().hex}")

    def start(self) -> None:
        for kind in KINDS:
            self.agents[kind] = HostileAgent(kind, size=self.oversize).start()

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()

    def register(self, settings: Settings) -> None:
        """Register each service as the operator would: an http agent whose entry holds its
        URL, its request specs and, for the echo agent, the secret bound to it."""
        with session_scope(settings.database_url) as session:
            for kind, agent in self.agents.items():
                entry = registry.Entry(
                    name=agent_name(kind),
                    provider="http",
                    url=agent.url,
                    secret=SECRET_NAME if kind == "echo" else None,
                    options=_ENDPOINTS,
                )
                registry.add(session, settings, entry, utcnow())

    def env(self) -> dict[str, str]:
        """The secret's value, and its declaration bound to the echo agent alone."""
        bound = {SECRET_NAME: [self.agents["echo"].host]}
        return {SECRET_NAME: self.secret, "ORCH_PROVIDER_SECRETS": json.dumps(bound)}

    def secrets_seen(self) -> dict[str, int]:
        """Requests that carried the secret, per server."""
        return {kind: agent.secrets_seen([self.secret]) for kind, agent in self.agents.items()}

    def figures(self) -> dict[str, Any]:
        seen = self.secrets_seen()
        return {
            "secrets_seen_by_hostile_servers": sum(n for kind, n in seen.items() if kind != "echo"),
            "secrets_seen_by_bound_server": seen.get("echo", 0),
            "hostile_server_requests": {k: a.requests() for k, a in self.agents.items()},
        }

    def describe(self) -> list[dict[str, Any]]:
        return [agent.describe() for agent in self.agents.values()]


#: The http request specs of every hostile agent, relative to its registered URL.
_ENDPOINTS: dict[str, Any] = {
    "start": {"url": "/runs", "body": {"task": "{task}"}},
    "status": {"url": "/runs/{run_id}"},
    "cancel": {"url": "/runs/{run_id}/cancel"},
    "run_id_path": "id",
    "status_path": "state",
    "output_path": "result",
}


def agent_name(kind: str) -> str:
    """The registry name of the hostile agent of ``kind``."""
    return f"chaos-{kind}"


def _agent_flow(kind: str, rng: random.Random, misbound: bool) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": "s1",
        "agent": agent_name(kind),
        "task": f"hurt the fleet ({kind})",
        "poll_interval": 0.5,
        "max_poll_interval": 1.0,
        "timeout": round(rng.uniform(8.0, 15.0), 1),
    }
    if misbound:
        # The echo agent's secret added to another agent's headers: an entry's, never a step's.
        step["with"] = {"headers": {"Authorization": {"secret": SECRET_NAME, "prefix": "Bearer "}}}
    return {"name": f"hostile-{kind}", "steps": [step]}


def _fanout_flow(rng: random.Random, items: int, concurrency: int) -> dict[str, Any]:
    branch = {
        "provider": "scripted",
        "task": "work on {{ item }}",
        "poll_interval": 0.3,
        "max_poll_interval": 1.0,
        "timeout": MAX_STEP_TIMEOUT,
        "with": {"states": [["running", round(rng.uniform(0.2, 1.0), 2)], ["completed"]]},
    }
    fan = {
        "id": "wide",
        "for_each": [f"item-{n}" for n in range(items)],
        "max_concurrency": concurrency,
        "step": branch,
    }
    return {"name": "hostile-fanout", "steps": [fan]}


def plan_hostile(
    rng: random.Random, sizes: HostileSizes, settings: Settings, window: float
) -> list[RunPlan]:
    """The hostile owners' launches over ``window`` seconds (the storm registers apart)."""
    plans: list[RunPlan] = []

    def add(label: str, scenario: str, flow: dict[str, Any], owner: str, expect: str) -> None:
        at = round(rng.uniform(0.0, window), 2)
        plans.append(RunPlan(label, scenario, flow, owner, at, expect=expect))

    for kind in KINDS:
        for n in range(sizes.agent_runs):
            flow = _agent_flow(kind, rng, misbound=False)
            add(
                f"h-{kind}-{n}", f"hostile_{kind}", flow, AGENTS_OWNER, "completed|failed|timed_out"
            )
    for n in range(max(1, sizes.agent_runs // 2)):
        # The echo agent's secret named for the drip agent: refused at launch, nothing sent.
        flow = _agent_flow("drip", rng, misbound=True)
        add(f"h-misbound-{n}", "hostile_misbound_secret", flow, AGENTS_OWNER, REFUSED)
    concurrency = min(sizes.branches, settings.max_branch_concurrency)
    for n in range(sizes.fanouts):
        flow = _fanout_flow(rng, sizes.branches, concurrency)
        add(f"h-fanout-{n}", "hostile_fanout_at_budget", flow, FANOUT_OWNER, "completed")
        over = _fanout_flow(rng, sizes.branches + 1, concurrency)
        add(f"h-fanout-over-{n}", "hostile_fanout_over_budget", over, FANOUT_OWNER, REFUSED)
    return sorted(plans, key=lambda plan: plan.at)


@dataclass
class Storm:
    """The storm owner's schedules: registered at the start, paused when the window ends."""

    orch: Orchestrator
    size: int
    names: list[str] = field(default_factory=list)
    every: int = MIN_EVERY
    refusal: str = ""

    def _definition(self, name: str) -> dict[str, Any]:
        step = {
            "id": "s1",
            "provider": "scripted",
            "task": "storm",
            "poll_interval": 0.3,
            "max_poll_interval": 1.0,
            "timeout": 10.0,
            "with": {"states": [["running", 0.3], ["completed"]]},
        }
        return {"name": name, "steps": [step], "schedule": {"every": self.every}}

    def register(self) -> None:
        """Register schedules until ``size`` or the first refusal (a budget). A floor on
        ``every`` (the schedule pass's interval) refuses the first: it is then the smallest."""
        while len(self.names) < self.size:
            name = f"storm-{len(self.names):04d}"
            try:
                self.orch.register_workflow(self._definition(name), owner=STORM_OWNER)
            except ValidationError as exc:
                floor = max(MIN_EVERY, math.ceil(self.orch.settings.schedule_interval))
                if not self.names and "every" in str(exc) and self.every < floor:
                    self.every = floor
                    continue
                self.refusal = str(exc)[:300]
                return
            self.names.append(name)

    def pause(self) -> None:
        """Stop the storm so the drain can end (a paused schedule fires nothing)."""
        for name in self.names:
            self.orch.pause_schedule(name, owner=STORM_OWNER)

    def describe(self) -> dict[str, Any]:
        return {
            "asked": self.size,
            "registered": len(self.names),
            "every_s": self.every,
            "refusal": self.refusal,
        }
