"""Owner suspension: an operator stops one owner, and nothing new of it is admitted.

While an owner has a row in ``owner_suspensions``, its launches (the Python API, the CLI,
``POST /runs``, reruns, schedule fires), its registrations, its answers and approvals, the
branch runs of its new fan-outs and its API tokens are refused with
:class:`~orchestration.core.errors.OwnerSuspended`. Its live runs go on unless the operator
asked ``--cancel-live`` (``orchestration.runs.owner_cancels``). Every suspend and resume is
written to ``owner_events``, which outlives the suspension.

The launch's refusal is part of its own statement (:func:`admits`, a ``NOT EXISTS`` beside
the budgets in ``runs/launch_statement.py``), or the first statement of its transaction
(:func:`held`), never a read before it. On PostgreSQL a suspension also takes the table's
``ACCESS EXCLUSIVE`` lock before it writes: it waits for every transaction that has read the
table (a launch that has checked holds its ``ACCESS SHARE`` lock until it commits), and a
launch that starts meanwhile waits for it, then checks on a snapshot taken after the lock,
which sees the suspension. So a launch either commits before the suspension (and
``--cancel-live`` finds its run) or is refused; no launch slips between the two. The other
refusals (:func:`refuse`: a registration, an answer, an approval, a fan-out) read the table in
the write's own transaction, so the lock orders them the same way. The lock is held for one
insert; launches of every owner wait that long (and a suspension that stalls is ended by
PostgreSQL's idle-in-transaction timeout, ``ORCH_PROVIDER_TIMEOUT`` + 2 s).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, exists, select, text
from sqlalchemy.orm import Session

from orchestration.core.db import on_postgresql
from orchestration.core.errors import OwnerSuspended, ValidationError
from orchestration.core.models import OwnerEvent, OwnerSuspension

#: Longest reason an operator may give.
MAX_REASON_CHARS = 500
#: Where the cause of a run cancelled by a suspension starts (``explain`` looks for it).
CANCEL_CAUSE = "owner suspended"


@dataclass(frozen=True)
class Suspension:
    """One suspended owner, as ``owners list`` and the dashboard show it."""

    owner: str
    since: datetime
    reason: str
    by: str

    def error(self) -> OwnerSuspended:
        """The refusal of new work of this owner."""
        return OwnerSuspended(self.owner, _at(self.since), self.reason)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json`` and the API."""
        return {"owner": self.owner, "since": self.since, "reason": self.reason, "by": self.by}


def _at(when: datetime) -> str:
    return when.isoformat(timespec="seconds")


def _of(row: OwnerSuspension) -> Suspension:
    return Suspension(row.owner, row.suspended_at, row.reason, row.by)


def admits(owner: Any) -> ColumnElement[bool]:
    """``owner`` (a value or a bound parameter) is not suspended: for a write's own
    statement, beside what else admits it."""
    return ~exists(select(1).where(OwnerSuspension.owner == owner))


def held(owner: Any) -> list[ColumnElement[Any]]:
    """Since when and why ``owner`` is suspended (``NULL`` when not), as two labelled scalar
    subqueries for the statement that admits a write in its transaction."""
    found = select(OwnerSuspension).where(OwnerSuspension.owner == owner).subquery()
    return [
        select(found.c.suspended_at).scalar_subquery().label("suspended_at"),
        select(found.c.reason).scalar_subquery().label("suspended_for"),
    ]


def refusal(owner: str, since: datetime | None, reason: str | None) -> OwnerSuspended | None:
    """The error for what :func:`held` read (``None``: not suspended)."""
    if since is None:
        return None
    return OwnerSuspended(owner, _at(since), reason or "")


def of(session: Session, owner: str) -> Suspension | None:
    """The owner's suspension, if any."""
    row = session.get(OwnerSuspension, owner)
    return None if row is None else _of(row)


def refuse(session: Session, owner: str) -> None:
    """Raise :class:`OwnerSuspended` when ``owner`` is suspended. For writes that start new
    work under a lock of their own (an answer, an approval, a fan-out, a registration): the
    check is in the write's transaction."""
    found = of(session, owner)
    if found is not None:
        raise found.error()


def current(session: Session) -> dict[str, Suspension]:
    """Every suspended owner's suspension, by owner (a table operators keep small)."""
    query = select(OwnerSuspension).order_by(OwnerSuspension.owner)
    return {row.owner: _of(row) for row in session.scalars(query)}


def _lock(session: Session) -> None:
    """On PostgreSQL, the table's exclusive lock (see the module docstring)."""
    if on_postgresql(session):
        session.execute(text("LOCK TABLE owner_suspensions IN ACCESS EXCLUSIVE MODE"))


def suspend(
    session: Session, owner: str, now: datetime, *, reason: str, by: str
) -> tuple[Suspension, bool]:
    """Suspend ``owner``; the suspension and whether it is new (an owner already suspended
    keeps its first one). Raises :class:`ValidationError` for an empty owner or a reason
    that is empty or over :data:`MAX_REASON_CHARS`."""
    if not owner or len(owner) > 200:
        raise ValidationError("owner", "must be 1-200 characters")
    reason = " ".join(reason.split())
    if not reason or len(reason) > MAX_REASON_CHARS:
        raise ValidationError("reason", f"must be 1-{MAX_REASON_CHARS} characters")
    _lock(session)
    found = of(session, owner)
    if found is not None:
        return found, False
    session.add(OwnerSuspension(owner=owner, suspended_at=now, reason=reason, by=by))
    record(session, owner, now, "suspended", by=by, reason=reason)
    session.flush()
    return Suspension(owner, now, reason, by), True


def resume(session: Session, owner: str, now: datetime, *, by: str) -> Suspension | None:
    """Lift ``owner``'s suspension; the one lifted, ``None`` when it was not suspended."""
    row = session.get(OwnerSuspension, owner, with_for_update=True)
    if row is None:
        return None
    lifted = _of(row)
    session.delete(row)
    record(session, owner, now, "resumed", by=by, reason=lifted.reason)
    session.flush()
    return lifted


def record(
    session: Session,
    owner: str,
    now: datetime,
    kind: str,
    *,
    by: str,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """One row of the owner's audit."""
    session.add(OwnerEvent(owner=owner, at=now, kind=kind, reason=reason, by=by, detail=detail))


def history(session: Session, owner: str, *, last: int = 20) -> list[dict[str, Any]]:
    """The owner's latest audit rows, newest first."""
    rows = session.scalars(
        select(OwnerEvent)
        .where(OwnerEvent.owner == owner)
        .order_by(OwnerEvent.at.desc(), OwnerEvent.pk.desc())
        .limit(last)
    )
    return [
        {"at": row.at, "kind": row.kind, "reason": row.reason, "by": row.by, "detail": row.detail}
        for row in rows
    ]


def cancel_cause(suspension: Suspension) -> str:
    """The cause journalled on a run that ``--cancel-live`` cancelled."""
    return (
        f"{CANCEL_CAUSE}: owner {suspension.owner!r} suspended by {suspension.by} "
        f"({suspension.reason})"
    )


def note(session: Session, owner: str, cause: str | None) -> str | None:
    """What ``explain`` says of a run's owner: that the run was cancelled by a suspension
    (its ``cause``), or that the owner is suspended now; ``None`` when neither."""
    if cause is not None and cause.startswith(CANCEL_CAUSE):
        return f"it was cancelled when its owner was suspended ({cause})"
    found = of(session, owner)
    if found is None:
        return None
    return (
        f"its owner {owner!r} is suspended since {_at(found.since)} by {found.by} "
        f"({found.reason}): no launch, rerun, answer, approval or new fan-out of it is admitted"
    )
