"""``/dashboard/fleet``: the operator's view of the fleet (workers, the sweeper, the queue, runs
by health) and small plots of the last hour (runs started and ended, poll lateness, sweep
time), drawn on the server as SVG (no script, no CDN).

Only an operator's session sees it; an owner's gets ``403``: the fleet shows every owner's
load and worker names, which are the operator's to see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from orchestration.core.followups import Done
from orchestration.reads import fleet
from orchestration.runtime import broker_probe
from orchestration.surfaces.api.dashboard import relative, render, signed_in_as, to_login

router = APIRouter(prefix="/dashboard", include_in_schema=False)

#: Size of one plot (SVG user units).
PLOT_WIDTH, PLOT_HEIGHT = 360, 80


@dataclass(frozen=True)
class Bar:
    """One minute's bar: its box, and what its tooltip says."""

    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class Plot:
    """One plot of the last hour: an id, a caption naming its peak, and a bar per minute."""

    name: str
    caption: str
    bars: list[Bar]


def bars(values: Sequence[float | None], say: Callable[[float], str]) -> list[Bar]:
    """One bar per minute, scaled to the largest; the last minute on the right. A minute
    with nothing reported (``None``) has no bar, which a zero would misread."""
    tallest = max((value for value in values if value is not None), default=0) or 1
    width = PLOT_WIDTH / max(len(values), 1)
    found = []
    for index, value in enumerate(values):
        if value is None:
            continue
        height = PLOT_HEIGHT * value / tallest
        ago = len(values) - index
        found.append(
            Bar(
                index * width,
                PLOT_HEIGHT - height,
                max(width - 1, 1),
                height,
                f"{say(value)}, {ago} min ago",
            )
        )
    return found


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _worst(values: list[float | None]) -> str:
    reported = [value for value in values if value is not None]
    return f"worst {_seconds(max(reported))}" if reported else "nothing reported yet"


def plots(seen: fleet.Fleet) -> list[Plot]:
    """The page's four plots: runs started and ended, poll lateness p99, slowest sweep."""
    late = [None if one is None else one.quantile(0.99) for one in seen.poll_lateness]
    sweep = [None if one is None else one.largest for one in seen.sweep_seconds]
    return [
        Plot(
            "started",
            f"Runs started per minute (most {max(seen.started, default=0)})",
            bars(seen.started, lambda n: f"{n:.0f} runs started"),
        ),
        Plot(
            "ended",
            f"Runs ended per minute (most {max(seen.ended, default=0)})",
            bars(seen.ended, lambda n: f"{n:.0f} runs ended"),
        ),
        Plot(
            "poll-lateness",
            f"Poll lateness, p99 per minute ({_worst(late)})",
            bars(late, lambda v: f"p99 {_seconds(v)} late"),
        ),
        Plot(
            "sweep-time",
            f"Slowest sweeper pass per minute ({_worst(sweep)})",
            bars(sweep, lambda v: f"slowest pass {_seconds(v)}"),
        ),
    ]


@router.get("/fleet")
async def fleet_page(request: Request) -> Response:
    """Workers seen in the last hour (with their pools when they answer), the sweeper's last
    pass and what it did, the queue's depth, live runs by health, and per minute: runs
    started and ended, poll lateness and sweep time."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    if not signed.operator:
        return render(
            "error.html",
            403,
            **signed.page(),
            title="Refused",
            message="the fleet page is the operator's: sign in with an operator token",
        )
    orch = signed.orch
    now = orch.clock()
    seen = await run_in_threadpool(
        orch.transact, lambda session: Done(fleet.snapshot(session, orch.settings, now))
    )
    depth = await run_in_threadpool(broker_probe.queue_depth, orch.settings)
    answered, pools_age = await run_in_threadpool(broker_probe.pools, orch.settings)
    nodes = answered or {}
    # Steps record the host they ran on; Celery names its nodes ``name@host``.
    pools: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for node, pool in nodes.items():
        pools.setdefault(node.rpartition("@")[2], []).append((node, pool))
    return render(
        "fleet.html",
        **signed.page(),
        fleet=seen,
        depth=depth,
        pools=pools,
        pools_age=pools_age,
        pools_fresh=broker_probe.POOLS_FRESH,
        queue=orch.settings.queue,
        plots=plots(seen),
        width=PLOT_WIDTH,
        height=PLOT_HEIGHT,
        now=now,
        relative=relative,
    )
