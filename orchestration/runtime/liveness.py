"""Liveness of the parts a run depends on: database, broker, sweeper.

Used by ``orchestration health``, the HTTP ``/healthz``, the metrics and ``explain``, so a dead
sweeper is visible everywhere the same way (:class:`SweeperLiveness` says it once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text

from orchestration.core.db import get_engine, session_scope, utcnow
from orchestration.core.errors import DatabaseNotReady
from orchestration.core.models import SweeperBeat
from orchestration.core.settings import Settings
from orchestration.runtime import readiness
from orchestration.upkeep.sweeper import SWEEPER_NAME

#: The sweeper counts as dead after this many missed intervals.
SWEEPER_MISSED_INTERVALS = 3
#: Longest the broker check waits for a connection (seconds).
BROKER_TIMEOUT = 3.0


def last_pass(settings: Settings) -> SweeperBeat | None:
    """The sweeper's liveness row (``None`` before its first pass)."""
    with session_scope(settings.database_url) as session:
        beat = session.get(SweeperBeat, SWEEPER_NAME)
        if beat is not None:
            session.expunge(beat)
        return beat


def sweeper_age(settings: Settings, now: datetime) -> float | None:
    """Seconds since the sweeper's last pass (``None`` if it never ran)."""
    beat = last_pass(settings)
    return None if beat is None else (now - beat.last_pass_at).total_seconds()


@dataclass(frozen=True)
class SweeperLiveness:
    """The sweeper's last pass, judged: alive when it passed within
    :data:`SWEEPER_MISSED_INTERVALS` intervals."""

    #: Seconds since the last pass (``None``: it never ran).
    age: float | None
    #: ``ORCH_SWEEP_INTERVAL``.
    interval: float
    #: ``ORCH_UPKEEP_QUEUE``: where beat sends the passes.
    queue: str

    @property
    def limit(self) -> float:
        return SWEEPER_MISSED_INTERVALS * self.interval

    @property
    def ok(self) -> bool:
        return self.age is not None and self.age <= self.limit

    @property
    def detail(self) -> str:
        """The health report's line."""
        if self.age is None:
            return f"never ran: is beat running, and a worker consuming queue {self.queue!r}?"
        return f"last pass {self.age:.0f}s ago (limit {self.limit:.0f}s)"

    @property
    def doubt(self) -> str | None:
        """What ``explain`` says of a sweeper that is not alive (``None`` when it is)."""
        if self.ok:
            return None
        if self.age is None:
            missed = "no sweeper pass has run yet"
        else:
            missed = (
                f"no sweeper pass for {self.age / self.interval:.0f} intervals of "
                f"{self.interval:g}s (the last {self.age:.0f}s ago)"
            )
        return (
            f"{missed}: beat must run (`orchestration beat`) and a worker must consume queue "
            f"{self.queue!r} (`orchestration worker`)"
        )


def sweeper_liveness(settings: Settings, now: datetime) -> SweeperLiveness:
    """The sweeper's liveness at ``now``, read from its row."""
    return SweeperLiveness(
        sweeper_age(settings, now), settings.sweep_interval, settings.upkeep_queue
    )


def check(
    settings: Settings, now: datetime | None = None, *, where: bool = False
) -> dict[str, Any]:
    """Each part's status and a one-line detail; ``ok`` only if all are. With ``where`` (the
    operator's ``orchestration health``), a part that is down is named by its address
    (password masked) and the cause in its own words; without it (the public ``/healthz``)
    only by the kind of error."""
    now = now or utcnow()
    checks: dict[str, dict[str, Any]] = {}
    url = settings.database_url
    try:
        readiness.require_database(url)
        with get_engine(url).connect() as connection:
            connection.execute(text("SELECT 1"))
        checks["database"] = {"ok": True, "detail": "reachable"}
    except DatabaseNotReady as exc:
        checks["database"] = {"ok": False, "detail": str(exc) if where else "missing"}
    except Exception as exc:
        detail = f"unreachable: {type(exc).__name__}"
        if where:
            address = readiness.database_address(url)
            detail = f"the database at {address} is unreachable ({readiness.first_line(exc)})"
        checks["database"] = {"ok": False, "detail": detail}
    problem = readiness.broker_problem(settings, BROKER_TIMEOUT)
    if problem is None:
        checks["broker"] = {"ok": True, "detail": "reachable"}
    else:
        checks["broker"] = {"ok": False, "detail": problem if where else "unreachable"}
    if checks["database"]["ok"]:
        try:
            sweeper = sweeper_liveness(settings, now)
        except Exception as exc:
            checks["sweeper"] = {"ok": False, "detail": type(exc).__name__}
        else:
            checks["sweeper"] = {"ok": sweeper.ok, "detail": sweeper.detail}
            if sweeper.age is not None:
                checks["sweeper"]["age_seconds"] = sweeper.age
    else:
        checks["sweeper"] = {"ok": False, "detail": "unknown: database unreachable"}
    return {"ok": all(part["ok"] for part in checks.values()), "checks": checks}
