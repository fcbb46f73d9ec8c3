"""What a launch records of its steps' agents (``steps.evidence``'s ``launch``): the version
a pinned step is held to when its turn starts (``execution.agent_checks``).

A step that names an agent, or is pinned, is described; a branching step's own steps (its
``for_each`` step, its ``parallel`` steps) are described too and kept on the branching
step's row under ``branches`` (by step id), from where each branch run's step takes its
``launch`` when the branch is made. All of a launch's calls share one
``ORCH_PROVIDER_TIMEOUT``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.providers import budget, evidence
from orchestration.workflows import agents
from orchestration.workflows.steps import StepSpec


def _one(settings: Settings, step: StepSpec, where: str, now: datetime) -> dict[str, Any] | None:
    """What the step's agent says of itself, when the step names one or is pinned; a pinned
    step whose agent cannot say refuses the launch, naming the step."""
    if step.branching or step.approval is not None or not (step.agent or step.pin):
        return None
    found = evidence.observe(settings, step.provider, step.options, now)
    if step.pin and found is not None and "error" in found:
        raise ValidationError(
            f"{where}.pin",
            f"step {step.id!r} is pinned, but its agent's version could not be read at "
            f"launch: {found['error']}",
        )
    return found


def _branches(step: StepSpec) -> list[tuple[str, StepSpec]]:
    """A branching step's own steps, each with where it is written."""
    if step.step is not None:
        return [("step", step.step)]
    if step.parallel is not None:
        return [(f"parallel.steps[{n}]", inner) for n, inner in enumerate(step.parallel.steps)]
    return []


def described(
    settings: Settings,
    steps: tuple[StepSpec, ...],
    kept: Mapping[str, Any] | None,
    now: datetime,
) -> tuple[dict[str, Any] | None, ...]:
    """Each top-level step's ``evidence`` column as its launch writes it (``None``: none)."""
    seen: list[dict[str, Any] | None] = []
    with budget.within(settings.provider_timeout):
        for index, step in enumerate(steps):
            where = f"steps[{index}]"
            if not step.branching:
                found = _one(settings, step, where, now)
                seen.append(None if found is None else {"launch": found})
                continue
            inner: dict[str, Any] = {}
            for field, branch in _branches(step):
                (resolved,) = agents.applied((branch,), kept)
                found = _one(settings, resolved, f"{where}.{field}", now)
                if found is not None:
                    inner[branch.id] = found
            seen.append({"branches": inner} if inner else None)
    return tuple(seen)
