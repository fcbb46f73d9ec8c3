"""Plain owners' step latency: how long a plain step waits for the fleet once it may start,
the pace a hostile owner could take from everyone else.

A step may start at its run's launch (the first step) or when the step before it ended; its
latency is from then until the engine started it (``steps.started_at``). Only what the fleet
decides is measured: a plain owner's root runs (not branch runs, whose admission is their
parent's ``max_concurrency``), first attempts (a retry waits its backoff on purpose), scripted
steps, not the keyed scenarios (a run queued behind its concurrency key waits on purpose), and
not the runs a fault struck (a run whose worker was killed waits for the heartbeat timeout: at
the CI profile's size those few waits are the p99, whatever else runs beside them).
The report compares the p99 of a plain pass with that of the same seed with hostile owners.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from chaos.hostile import is_plain


def plain_step_latencies(
    runs: Mapping[str, Any],
    steps: Mapping[str, Sequence[Any]],
    scenario_of: Callable[[Any], str],
    struck: Collection[str] = (),
) -> list[float]:
    """Seconds from each measured plain step's readiness to its start."""
    found: list[float] = []
    for run_id, run in runs.items():
        if run.parent_run_id is not None or not is_plain(run.owner) or run_id in struck:
            continue
        if scenario_of(run).startswith("keyed"):
            continue
        ready = run.created_at
        for step in steps.get(run_id, []):
            if (
                step.provider == "scripted"
                and step.attempt == 1
                and step.started_at is not None
                and ready is not None
            ):
                found.append(max(0.0, (step.started_at - ready).total_seconds()))
            ready = step.finished_at
            if ready is None:
                break
    return found


def comparison(alone: dict[str, Any], beside: dict[str, Any]) -> dict[str, Any]:
    """The plain pass's latency against the hostile pass's, and the ratio of each percentile
    (the p99 is what the report names; at a hundred steps it is one step, so the p50 and p90
    ratios come with it)."""
    ratios: dict[str, float | None] = {}
    for rank in ("p50", "p90", "p99"):
        base, now = alone.get(rank), beside.get(rank)
        ratios[f"{rank}_ratio"] = round(now / base, 2) if base and now is not None else None
    return {"plain_alone": alone, "beside_hostile": beside, **ratios}
