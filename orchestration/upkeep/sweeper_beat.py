"""The sweeper's liveness row (``sweeper_beats``): when its last pass ran, how long it took,
what it did; ``orchestration health`` and the fleet page read it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from orchestration.core.followups import Done
from orchestration.core.models import SweeperBeat
from orchestration.upkeep import fleet_series


def write(session: Session, name: str, now: datetime, report: dict[str, Any]) -> Done[None]:
    """Stamp the pass on sweeper ``name``'s row (locked: two beats count every pass) and add
    its time to the fleet series, dropping what the fleet page no longer shows."""
    beat = session.get(SweeperBeat, name, with_for_update=True)
    if beat is None:
        session.add(
            SweeperBeat(
                name=name,
                last_pass_at=now,
                passes=1,
                last_pass_seconds=report["seconds"],
                last_report=report,
            )
        )
    else:
        beat.last_pass_at = max(beat.last_pass_at, now)
        beat.passes += 1
        beat.last_pass_seconds = report["seconds"]
        beat.last_report = report
    fleet_series.record(
        session,
        fleet_series.Series.SWEEP_SECONDS,
        name,
        now,
        fleet_series.Summary.of([report["seconds"]]),
    )
    fleet_series.forget(session, now)
    return Done(None)
