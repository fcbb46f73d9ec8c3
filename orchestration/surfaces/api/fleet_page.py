"""``/dashboard/fleet``: the operator's view of the fleet (workers, the sweeper, the queue, runs
by health) and small plots of the last hour, drawn on the server as SVG (no script, no CDN).

Only an operator's session sees it; an owner's gets ``403``: the fleet shows every owner's
load and worker names, which are the operator's to see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from orchestration import fleet
from orchestration.followups import Done
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


def bars(counts: list[int], what: str) -> list[Bar]:
    """One bar per minute, scaled to the largest; the last minute on the right."""
    tallest = max(counts, default=0) or 1
    width = PLOT_WIDTH / max(len(counts), 1)
    found = []
    for index, count in enumerate(counts):
        height = PLOT_HEIGHT * count / tallest
        ago = len(counts) - index
        found.append(
            Bar(index * width, PLOT_HEIGHT - height, max(width - 1, 1), height,
                f"{count} {what}, {ago} min ago")
        )  # fmt: skip
    return found


@router.get("/fleet")
async def fleet_page(request: Request) -> Response:
    """Workers seen in the last hour (with their pools when they answer), the sweeper's last
    pass and what it did, the queue's depth, live runs by health, and runs started and
    ended per minute."""
    signed = await run_in_threadpool(signed_in_as, request)
    if signed is None:
        return to_login()
    if not signed.operator:
        return render(
            "error.html", 403, **signed.page(), title="Refused",
            message="the fleet page is the operator's: sign in with an operator token",
        )  # fmt: skip
    orch = signed.orch
    now = orch.clock()
    seen = await run_in_threadpool(
        orch.transact, lambda session: Done(fleet.snapshot(session, orch.settings, now))
    )
    depth = await run_in_threadpool(broker_probe.queue_depth, orch.settings)
    nodes = await run_in_threadpool(broker_probe.pools, orch.settings) or {}
    # Steps record the host they ran on; Celery names its nodes ``name@host``.
    pools: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for node, pool in nodes.items():
        pools.setdefault(node.rpartition("@")[2], []).append((node, pool))
    plots: dict[str, Any] = {
        "started": bars(seen.started, "runs started"),
        "ended": bars(seen.ended, "runs ended"),
    }
    return render(
        "fleet.html",
        **signed.page(),
        fleet=seen,
        depth=depth,
        pools=pools,
        queue=orch.settings.queue,
        plots=plots,
        width=PLOT_WIDTH,
        height=PLOT_HEIGHT,
        now=now,
        relative=relative,
    )
