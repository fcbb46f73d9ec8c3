"""Liveness of the parts a run depends on: database, broker, sweeper.

Used by ``orchestration health``, the HTTP ``/healthz`` and the metrics, so a dead sweeper is
visible everywhere the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kombu.connection import Connection
from sqlalchemy import text

from orchestration.db import get_engine, session_scope, utcnow
from orchestration.models import SweeperBeat
from orchestration.settings import Settings
from orchestration.sweeper import SWEEPER_NAME

#: The sweeper counts as dead after this many missed intervals.
SWEEPER_MISSED_INTERVALS = 3


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


def check(settings: Settings, now: datetime | None = None) -> dict[str, Any]:
    """Each part's status and a one-line detail; ``ok`` only if all are."""
    now = now or utcnow()
    checks: dict[str, dict[str, Any]] = {}
    try:
        with get_engine(settings.database_url).connect() as connection:
            connection.execute(text("SELECT 1"))
        checks["database"] = {"ok": True, "detail": "reachable"}
    except Exception as exc:
        checks["database"] = {"ok": False, "detail": f"unreachable: {type(exc).__name__}"}
    try:
        with Connection(settings.broker_url, connect_timeout=3) as connection:  # type: ignore[no-untyped-call]
            connection.ensure_connection(max_retries=1, timeout=3)
        checks["broker"] = {"ok": True, "detail": "reachable"}
    except Exception as exc:
        checks["broker"] = {"ok": False, "detail": f"unreachable: {type(exc).__name__}"}
    if checks["database"]["ok"]:
        try:
            age = sweeper_age(settings, now)
        except Exception as exc:
            age, checks["sweeper"] = None, {"ok": False, "detail": type(exc).__name__}
        else:
            limit = SWEEPER_MISSED_INTERVALS * settings.sweep_interval
            if age is None:
                checks["sweeper"] = {"ok": False, "detail": "never ran: is beat running?"}
            else:
                checks["sweeper"] = {
                    "ok": age <= limit,
                    "detail": f"last pass {age:.0f}s ago (limit {limit:.0f}s)",
                    "age_seconds": age,
                }
    else:
        checks["sweeper"] = {"ok": False, "detail": "unknown: database unreachable"}
    return {"ok": all(part["ok"] for part in checks.values()), "checks": checks}
