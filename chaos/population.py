"""The population of runs a chaos run launches: scenarios, and a seeded plan of them.

Each scenario is a workflow of ``scripted`` steps (a real provider whose turns are rows in the
database), retried steps, approval steps and branching steps (``for_each``, ``parallel``),
plus what the driver does to the run after launch: answer its human park, decide its
approval, cancel it (a storm of concurrent cancels, a graceful cancel, a cancel timed against
the last step's completion), or send its chain again mid-run. Every step has a ``timeout``, so
every run has an end even if nobody acts: the drain phase can wait for all of them.

The seed fixes the plan (which runs, their scripts, launch offsets and follow-ups) and the fault
plan; it cannot fix the interleaving of processes, so it reproduces a chaos run, not a trace.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

#: Relative weights of the single-run scenarios.
WEIGHTS: dict[str, int] = {
    "complete": 14,
    "multi_step": 12,
    "idle": 6,
    "fail": 6,
    "hang": 6,
    "human_answered": 7,
    "human_unanswered": 4,
    "rate_limit_resume": 5,
    "rate_limit_expire": 3,
    "slow_poll": 7,
    "long_countdown": 7,
    "effect_fail": 3,
    "cancel_storm": 6,
    "graceful_cancel": 3,
    "cancel_race": 6,
    "keyed": 5,
    "retry_recovers": 5,
    "retry_exhausted": 3,
    "retry_rate_limited": 3,
    "approval_approved": 4,
    "approval_expired": 3,
    "branches_joined": 4,
    "branches_fail_fast": 3,
    "branches_cancelled": 3,
}

#: Every step ends by this many seconds after it starts, whatever its script says.
MAX_STEP_TIMEOUT = 20.0


@dataclass
class RunPlan:
    """One run to launch and what to do with it afterwards."""

    label: str
    scenario: str
    workflow: dict[str, Any]
    owner: str
    at: float
    args: dict[str, Any] = field(default_factory=dict)
    concurrency_key: str | None = None
    on_conflict: str = "reject"
    twice: bool = False
    follow_up: str | None = None
    follow_at: float = 0.0
    expect: str = ""


def _step(
    step_id: str, states: list[list[Any]], rng: random.Random, **extra: Any
) -> dict[str, Any]:
    options = {"states": states, **extra.pop("with", {})}
    poll = extra.pop("poll_interval", rng.choice([0.2, 0.3, 0.5]))
    return {
        "id": step_id,
        "provider": "scripted",
        "task": extra.pop("task", f"do {step_id}"),
        "poll_interval": poll,
        "max_poll_interval": extra.pop("max_poll_interval", max(poll, 1.0)),
        "timeout": extra.pop("timeout", MAX_STEP_TIMEOUT),
        "with": options,
        **extra,
    }


def _flow(name: str, *steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "steps": list(steps)}


def _running(rng: random.Random, low: float, high: float) -> list[Any]:
    return ["running", round(rng.uniform(low, high), 2)]


def workflow_for(scenario: str, rng: random.Random) -> tuple[dict[str, Any], str]:
    """The workflow of a single-run scenario and the outcome it aims at."""
    if scenario == "complete":
        return _flow(
            scenario, _step("s1", [_running(rng, 0.2, 2.0), ["completed"]], rng)
        ), "completed"
    if scenario == "multi_step":
        count = rng.randint(2, 3)
        steps = [
            _step(f"s{i + 1}", [_running(rng, 0.2, 1.5), ["completed"]], rng) for i in range(count)
        ]
        steps[-1]["task"] = {"previous": "{{ steps.s1.output }}"}
        return _flow(scenario, *steps), "completed"
    if scenario == "idle":
        step = _step("s1", [_running(rng, 0.2, 1.5), ["idle"]], rng, **{"with": {"output": "ok"}})
        return _flow(scenario, step), "completed"
    if scenario == "fail":
        failing = _step("s1", [_running(rng, 0.2, 1.5), ["failed"]], rng)
        failing["with"]["error"] = "scripted refusal"
        return _flow(scenario, failing), "failed"
    if scenario == "hang":
        return _flow(
            scenario, _step("s1", [["running"]], rng, timeout=round(rng.uniform(3.0, 8.0), 1))
        ), "timed_out"
    if scenario in ("human_answered", "human_unanswered"):
        step = _step(
            "s1",
            [_running(rng, 0.2, 0.8), ["input_required"]],
            rng,
            **{"with": {"prompt": "approve?", "resume_states": [["running", 0.5], ["completed"]]}},
        )
        return _flow(scenario, step), ("completed" if scenario == "human_answered" else "timed_out")
    if scenario == "rate_limit_resume":
        step = _step(
            "s1",
            [_running(rng, 0.2, 0.6), ["rate_limited", 1.5], ["completed"]],
            rng,
            **{"with": {"reset_after": 1.5}},
        )
        return _flow(scenario, step), "completed"
    if scenario == "rate_limit_expire":
        step = _step(
            "s1", [_running(rng, 0.2, 0.6), ["rate_limited"]], rng, **{"with": {"reset_after": 1}}
        )
        return _flow(scenario, step), "timed_out"
    if scenario == "slow_poll":
        # Each status call blocks: a poll is in flight most of the time (SIGSTOP, cancel kill).
        step = _step(
            "s1",
            [_running(rng, 4.0, 7.0), ["completed"]],
            rng,
            poll_interval=0.2,
            max_poll_interval=0.5,
            **{"with": {"poll_delay": round(rng.uniform(1.0, 2.0), 2)}},
        )
        return _flow(scenario, step), "completed"
    if scenario == "long_countdown":
        # Long countdowns: the step spends its life as an ETA message held by a worker.
        step = _step(
            "s1",
            [_running(rng, 6.0, 10.0), ["completed"]],
            rng,
            poll_interval=1.5,
            max_poll_interval=2.0,
        )
        return _flow(scenario, step), "completed"
    if scenario == "effect_fail":
        step = _step(
            "s1",
            [_running(rng, 0.2, 1.0), ["completed"]],
            rng,
            **{"with": {"checkpoint_fails": True}},
        )
        return _flow(scenario, step), "failed"
    if scenario in ("cancel_storm", "graceful_cancel"):
        step = _step(
            "s1",
            [["running"]],
            rng,
            poll_interval=rng.choice([0.3, 1.0, 1.5]),
            max_poll_interval=2.0,
        )
        return _flow(scenario, step), "cancelled"
    if scenario == "cancel_race":
        first = _step("s1", [_running(rng, 0.2, 0.6), ["completed"]], rng)
        last = _step(
            "s2",
            [["running", round(rng.uniform(1.0, 2.5), 2)], ["completed"]],
            rng,
            poll_interval=0.2,
            max_poll_interval=0.3,
        )
        return _flow(scenario, first, last), "completed|cancelled"
    if scenario.startswith("retry_"):
        return _retrying(scenario, rng)
    if scenario.startswith("branches_"):
        return _branching(scenario, rng)
    if scenario.startswith("approval_"):
        approved = scenario == "approval_approved"
        review = {
            "id": "review",
            "approval": {
                "prompt": "ship {{ args.what }}?",
                "expires_in": 15.0 if approved else round(rng.uniform(1.5, 4.0), 2),
                "on_expiry": "reject" if approved else rng.choice(["reject", "fail"]),
            },
        }
        ship = _step("s2", [_running(rng, 0.2, 0.8), ["completed"]], rng)
        return _flow(scenario, review, ship), "completed" if approved else "failed"
    raise ValueError(f"unknown scenario {scenario!r}")


def _retrying(scenario: str, rng: random.Random) -> tuple[dict[str, Any], str]:
    """Steps whose attempts fail (or are rate limited) before the last: each attempt a turn of
    its own key, the wait between them a countdown."""
    backoff = round(rng.uniform(0.2, 1.0), 2)
    retry: dict[str, Any] = {"attempts": 3, "backoff": backoff, "max_backoff": 2.0}
    if scenario == "retry_recovers":
        failing = [_running(rng, 0.2, 0.8), ["failed"]]
        options = {"attempt_states": [failing, [["failed"]]][: rng.randint(1, 2)]}
        step = _step("s1", [_running(rng, 0.2, 0.8), ["completed"]], rng, **{"with": options})
        return _flow(scenario, {**step, "retry": retry}), "completed"
    if scenario == "retry_exhausted":
        step = _step("s1", [_running(rng, 0.2, 0.8), ["failed"]], rng)
        return _flow(scenario, {**step, "retry": {**retry, "attempts": 2}}), "failed"
    # A rate-limited turn is stopped (by the stop task) before the next attempt starts.
    limited: dict[str, Any] = {
        "attempt_states": [[_running(rng, 0.2, 0.6), ["rate_limited", 600]]],
        "reset_after": round(rng.uniform(0.3, 1.5), 2),
    }
    step = _step("s1", [_running(rng, 0.2, 0.8), ["completed"]], rng, **{"with": limited})
    return _flow(scenario, {**step, "retry": {**retry, "on": ["rate_limited"]}}), "completed"


def _branching(scenario: str, rng: random.Random) -> tuple[dict[str, Any], str]:
    """Branch runs: a for_each admitted two or three at a time and joined, a parallel step
    whose failing branch cancels its sibling (``join: all``), and a fan-out cancelled while
    its branches run (a branch started after the cancel counts as an extra turn)."""
    if scenario == "branches_fail_fast":
        bad = _step("bad", [_running(rng, 0.3, 1.5), ["failed"]], rng, **{"with": {"error": "no"}})
        slow = _step("slow", [["running"]], rng, timeout=MAX_STEP_TIMEOUT)
        fan: dict[str, Any] = {"id": "drafts", "parallel": {"join": "all", "steps": [bad, slow]}}
        return _flow(scenario, fan), "failed"
    cancelled = scenario == "branches_cancelled"
    states: list[list[Any]] = (
        [["running"]] if cancelled else [_running(rng, 0.2, 1.2), ["completed"]]
    )
    branch = _step("research", states, rng, task="research {{ item }}")
    branch.pop("id")  # a for_each's branch is named by its step
    fan = {
        "id": "research",
        "for_each": [f"topic-{n}" for n in range(rng.randint(3, 6))],
        "max_concurrency": rng.choice([2, 3]),
        "step": branch,
    }
    last = _step("s2", [["completed"]], rng, task={"notes": "{{ steps.research.output }}"})
    return _flow(scenario, fan, last), "cancelled" if cancelled else "completed"


def _keyed_group(rng: random.Random, label: str, owner: str, at: float) -> list[RunPlan]:
    """A holder and the runs that arrive on its concurrency key with each policy."""
    key = f"key-{label}"
    holder, _ = workflow_for("complete", rng)
    holder["steps"][0]["with"]["states"] = [_running(rng, 2.0, 4.0), ["completed"]]
    plans = [
        RunPlan(
            f"{label}-holder",
            "keyed_holder",
            holder,
            owner,
            at,
            concurrency_key=key,
            on_conflict="reject",
            expect="completed|cancelled",
        )
    ]
    for index, policy in enumerate(rng.sample(["enqueue", "enqueue", "interrupt", "reject"], 3)):
        flow, _ = workflow_for("complete", rng)
        plans.append(
            RunPlan(
                f"{label}-{policy}-{index}",
                f"keyed_{policy}",
                flow,
                owner,
                at + 0.4 + index * rng.uniform(0.3, 1.2),
                concurrency_key=key,
                on_conflict=policy,
                expect="completed|cancelled|rejected",
            )
        )
    return plans


def plan_population(rng: random.Random, runs: int, window: float, owners: int = 3) -> list[RunPlan]:
    """``runs`` runs launched over ``window`` seconds, sorted by launch offset."""
    names = list(WEIGHTS)
    weights = [WEIGHTS[name] for name in names]
    plans: list[RunPlan] = []
    serial = 0
    while len(plans) < runs:
        serial += 1
        scenario = rng.choices(names, weights)[0]
        owner = f"chaos-owner-{rng.randrange(owners)}"
        at = round(rng.uniform(0.0, window), 2)
        label = f"r{serial:04d}"
        if scenario == "keyed":
            if runs - len(plans) < 4:
                continue
            plans.extend(_keyed_group(rng, label, owner, at))
            continue
        flow, expect = workflow_for(scenario, rng)
        plan = RunPlan(label, scenario, flow, owner, at, expect=expect)
        plan.twice = rng.random() < 0.12
        if scenario == "human_answered":
            plan.follow_up = "answer"
        elif scenario == "approval_approved":
            plan.follow_up = "approve"
            plan.args = {"what": label}
        elif scenario == "approval_expired":
            plan.args = {"what": label}
        elif scenario in ("cancel_storm", "branches_cancelled"):
            plan.follow_up, plan.follow_at = "storm", round(rng.uniform(0.5, 4.0), 2)
        elif scenario == "graceful_cancel":
            plan.follow_up, plan.follow_at = "graceful", round(rng.uniform(1.0, 3.0), 2)
        elif scenario == "cancel_race":
            plan.follow_up = "race"
        elif rng.random() < 0.08:
            plan.follow_up, plan.follow_at = "resend", round(rng.uniform(0.5, 2.5), 2)
        plans.append(plan)
    return sorted(plans, key=lambda p: p.at)
