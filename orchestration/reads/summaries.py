"""Run summaries: what a list shows, read column by column, never a run's payloads.

A list used to build full records (workflow, args, result, every step's input, output and
prompt) for every row it read, so one ``GET /runs?health=`` could pull thousands of payloads
(issue 10). A summary is the run's scalar columns, its error cut to
:data:`ERROR_CHARS`, the id of the step it is on, and its health; the full record stays on
``Orchestrator.get``.

Health is computed in SQL by :func:`orchestration.core.health.expression`, the one place it is
written, so a health filter is a ``WHERE`` clause and a page costs one bounded query, however
many runs an owner has.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import ColumnElement, and_, bindparam, func, select
from sqlalchemy.orm import Session, aliased

from orchestration.core import health as judgement
from orchestration.core.errors import ValidationError
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_LIVE, RUN_TERMINAL, Health, RunStatus

#: Characters of a run's error a summary carries; the full text is on the record.
ERROR_CHARS = 200

_LIVE = sorted(s.value for s in RUN_LIVE)
_TERMINAL = sorted(s.value for s in RUN_TERMINAL)


class RunSummary(BaseModel):
    """A run as a list shows it: no workflow, args, result or step payloads."""

    id: str
    owner: str
    request_id: str
    workflow_name: str
    #: The registered version it runs (``None``: launched from a file).
    workflow_version: int | None = None
    status: str
    health: str
    stop_reason: str | None
    #: The first :data:`ERROR_CHARS` characters, ending in ``…`` when cut.
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    heartbeat_at: datetime | None
    cancel_requested_at: datetime | None
    deadline_at: datetime | None
    #: Index of the step the run is on, and that step's id.
    current_step: int
    current_step_id: str | None
    rearms: int
    park_reason: str | None
    parked_since: datetime | None
    waiting_until: datetime | None
    concurrency_key: str | None
    concurrency: str | None
    needs_review: bool


class ParentSummary(RunSummary):
    """A top-level run as the dashboard lists it: its summary, and how many branch runs its
    ``for_each`` and ``parallel`` steps made (listed on its own page, not in the list)."""

    branches: int


#: The run columns a summary reads, by name; JSON columns are never among them.
_COLUMNS = (
    Run.id,
    Run.owner,
    Run.request_id,
    Run.workflow_name,
    Run.workflow_version,
    Run.status,
    Run.stop_reason,
    Run.created_at,
    Run.started_at,
    Run.finished_at,
    Run.updated_at,
    Run.heartbeat_at,
    Run.cancel_requested_at,
    Run.deadline_at,
    Run.current_step,
    Run.rearms,
    Run.park_reason,
    Run.parked_since,
    Run.waiting_until,
    Run.concurrency_key,
    Run.concurrency,
    Run.needs_review,
)


def status_in(statuses: list[str]) -> ColumnElement[bool]:
    """``status IN (...)`` with the values written into the SQL, not bound: PostgreSQL can
    use a partial index (``ix_runs_live``, ``ix_runs_owner_live``) only when it sees that the
    query's statuses are the index's, also under a cached generic plan."""
    return Run.status.in_(bindparam(None, statuses, expanding=True, literal_execute=True))


def live() -> ColumnElement[bool]:
    """Live runs, in the form the partial indexes match."""
    return status_in(_LIVE)


def terminal() -> ColumnElement[bool]:
    """Terminal runs."""
    return status_in(_TERMINAL)


def health_filter(health: str) -> ColumnElement[bool]:
    """The ``WHERE`` clause for runs with ``health`` (bound with ``health.params``).

    The status test comes first and alone decides ``ended``, so the database can answer from
    the status indexes (a live health reads live rows only, through ``ix_runs_owner_live``).
    """
    if health == Health.ENDED.value:
        return terminal()
    return and_(live(), judgement.expression() == health)


def _error(text: str | None) -> str | None:
    if text is None or len(text) <= ERROR_CHARS:
        return text
    return text[: ERROR_CHARS - 1] + "…"


def check_filters(status: str | None, health: str | None, limit: int, most: int) -> None:
    """Raise :class:`ValidationError` for an unknown status or health, or a ``limit`` outside
    1..``most``."""
    if status is not None and status not in {s.value for s in RunStatus}:
        raise ValidationError(
            "status", f"unknown status {status!r}; one of {[s.value for s in RunStatus]}"
        )
    if health is not None and health not in {h.value for h in Health}:
        raise ValidationError(
            "health", f"unknown health {health!r}; one of {[h.value for h in Health]}"
        )
    if not 1 <= limit <= most:
        raise ValidationError("limit", f"must be between 1 and {most}")


def listing(
    session: Session,
    settings: Settings,
    *,
    owner: str | None,
    now: datetime,
    status: str | None = None,
    health: str | None = None,
    limit: int,
    before: datetime | None = None,
    top_level: bool = False,
) -> list[RunSummary]:
    """Up to ``limit`` of ``owner``'s runs (every owner's for ``None``), newest first (ties
    by id descending), as summaries.

    ``status`` and ``health`` filter in SQL; ``before`` (a ``created_at``) pages back.
    ``top_level`` leaves branch runs out and gives each run its branch count
    (:class:`ParentSummary`), read through the branch index in the same statement. One
    statement, reading only the columns a summary holds; the caller has checked the values.
    """
    query = select(
        *_COLUMNS,
        func.substr(Run.error, 1, ERROR_CHARS + 1).label("error"),
        judgement.expression().label("health"),
        Step.step_id.label("current_step_id"),
    ).outerjoin(Step, and_(Step.run_id == Run.id, Step.index == Run.current_step))
    model: type[RunSummary] = RunSummary
    if top_level:
        branch = aliased(Run)
        count = (
            select(func.count())
            .select_from(branch)
            .where(branch.parent_run_id == Run.id)
            .correlate(Run)
            .scalar_subquery()
        )
        query = query.add_columns(count.label("branches")).where(Run.parent_run_id.is_(None))
        model = ParentSummary
    if owner is not None:
        query = query.where(Run.owner == owner)
    if status is not None:
        query = query.where(Run.status == status)
    if health is not None:
        query = query.where(health_filter(health))
    if before is not None:
        query = query.where(Run.created_at < before)
    query = query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit)
    summaries = []
    for row in session.execute(query, judgement.params(settings, now)).mappings():
        data: dict[str, Any] = dict(row)
        data["error"] = _error(data["error"])
        summaries.append(model.model_validate(data))
    return summaries
