"""Launch: validate, write the run and its steps in one transaction, then send the chain.

Also :func:`arm`, the one way a chain is (re)sent: at launch, when a queued run gets its
claim, when the sweeper re-arms a dead heartbeat, and when ``answer`` resumes a human park.
Task ids are chosen and stored before the chain is sent, after the transaction commits.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration import claims, deadlines, workflows
from orchestration.db import after_commit, session_scope
from orchestration.dispatch import Dispatcher, plan_chain
from orchestration.errors import IdempotencyConflict, LimitExceeded, ValidationError
from orchestration.models import Run, RunEvent, Step
from orchestration.settings import Settings
from orchestration.states import RUN_LIVE, STEP_LIVE, RunStatus, StepStatus

#: A literal condition (an IN list cannot be expanded inside an executemany).
_LIVE_STEP_SQL = text(
    "status IN ({})".format(", ".join(f"'{status.value}'" for status in sorted(STEP_LIVE)))
)
_NAME = re.compile(r"[\x21-\x7e]{1,200}")


def check_name(field: str, value: Any) -> str:
    """Owners, request ids and concurrency keys: 1-200 printable ASCII characters."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValidationError(field, "must be 1-200 printable ASCII characters without spaces")
    return value


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """The provider turn's key: at most one turn per (run, step, attempt)."""
    return f"{run_id}:{step_id}:{attempt}"


def step_timeout_at(run: Run, step: Step) -> datetime | None:
    """When the step's current attempt times out (``None`` before it starts)."""
    if step.started_at is None:
        return None
    return step.started_at + timedelta(seconds=float(run.workflow["steps"][step.index]["timeout"]))


def arm(
    session: Session,
    settings: Settings,
    run: Run,
    *,
    now: datetime,
    dispatcher: Dispatcher | None,
    claim: str | None = None,
    rearm: bool = False,
) -> list[str]:
    """Plan a chain from the run's first unfinished step, store its task ids, send after commit.

    The first link carries the step's current fencing tick, so whichever of this message and a
    late redelivery of the old one runs first wins, and the other is a no-op.
    """
    # Transitions write SQL directly: read the rows as they are now, not as this session
    # first loaded them (``answer`` has just reset the step's start, for one).
    session.refresh(run)
    steps = session.scalars(
        select(Step)
        .where(Step.run_id == run.id)
        .order_by(Step.index)
        .execution_options(populate_existing=True)
    ).all()
    live = [step for step in steps if step.status in STEP_LIVE]
    if not live:
        return []
    first = live[0]
    plan = plan_chain(run.id, first.index, len(steps), first.polls)
    values: dict[str, Any] = {
        "task_ids": [*run.task_ids, *plan.task_ids],
        "heartbeat_at": now,
        "current_step": first.index,
        "deadline_at": deadlines.compute(
            settings,
            RunStatus(run.status),
            heartbeat_at=now,
            step_timeout_at=step_timeout_at(run, first),
            park_reason=run.park_reason,
            parked_since=run.parked_since,
            waiting_until=run.waiting_until,
            cancel_requested_at=run.cancel_requested_at,
        ),
    }
    if claim is not None:
        values["claim"] = claim
    if rearm:
        values["rearms"] = Run.rearms + 1
    from orchestration.transitions import touch_run

    touch_run(session, run.id, now, **values)
    # One executemany for the whole chain (a statement per step cost a 200-step launch 213
    # statements); guarded like every step write: only live steps take a task id.
    table = cast(Table, Step.__table__)
    session.execute(
        update(table)
        .where(table.c.pk == bindparam("step_pk"), _LIVE_STEP_SQL)
        .values(celery_task_id=bindparam("task_id"), updated_at=now),
        [
            {"step_pk": step.pk, "task_id": link.task_id}
            for link, step in zip(plan.links, steps[first.index :], strict=True)
        ],
    )
    if dispatcher is not None:
        after_commit(session, lambda: dispatcher.send_chain(plan))
    return plan.task_ids


def launch(
    settings: Settings,
    dispatcher: Dispatcher | None,
    workflow: Any,
    args: Any,
    *,
    owner: str,
    request_id: str | None,
    concurrency_key: str | None,
    on_conflict: claims.OnConflict,
    now: datetime,
) -> str:
    """Validate and write the run; return its id. See ``service.Orchestrator.launch``."""
    check_name("owner", owner)
    if request_id is not None:
        check_name("request_id", request_id)
    if concurrency_key is not None:
        check_name("concurrency_key", concurrency_key)
    clean_args = workflows.check_args({} if args is None else args, settings)
    spec = workflows.parse(workflow, settings, args=clean_args)
    definition = spec.as_dict()
    # The whole request is fingerprinted: the same request_id with another workflow, args,
    # concurrency key or conflict policy is a different request, hence a conflict.
    print_ = workflows.fingerprint(
        definition,
        clean_args,
        extra={
            "concurrency_key": concurrency_key,
            "on_conflict": on_conflict.value if concurrency_key else None,
        },
    )
    rid = request_id or uuid.uuid4().hex
    for attempt in range(3):
        try:
            return _write(
                settings,
                dispatcher,
                definition,
                clean_args,
                print_,
                owner=owner,
                request_id=rid,
                concurrency_key=concurrency_key,
                on_conflict=on_conflict,
                now=now,
            )
        except IntegrityError:
            # A concurrent launch took the same request_id or the same claim: read it again.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _write(
    settings: Settings,
    dispatcher: Dispatcher | None,
    definition: dict[str, Any],
    args: dict[str, Any],
    fingerprint: str,
    *,
    owner: str,
    request_id: str,
    concurrency_key: str | None,
    on_conflict: claims.OnConflict,
    now: datetime,
) -> str:
    with session_scope(settings.database_url) as session:
        existing = session.scalars(
            select(Run).where(Run.owner == owner, Run.request_id == request_id)
        ).first()
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise IdempotencyConflict(request_id, existing.id)
            return existing.id
        _check_capacity(session, settings, owner)
        claim = None
        holder_deadline = None
        if concurrency_key is not None:
            current = claims.holder(session, owner, concurrency_key)
            holder_deadline = current.deadline_at if current is not None else None
            claim = claims.acquire(
                session,
                settings,
                dispatcher,
                owner=owner,
                key=concurrency_key,
                on_conflict=on_conflict,
                now=now,
            )
        run_id = uuid.uuid4().hex
        deadline = (
            claims.queued_deadline(settings, holder_deadline, now)
            if claim == claims.QUEUED
            else deadlines.compute(settings, RunStatus.QUEUED, heartbeat_at=now)
        )
        run = Run(
            id=run_id,
            owner=owner,
            request_id=request_id,
            fingerprint=fingerprint,
            workflow_name=definition["name"],
            workflow=definition,
            args=args,
            status=RunStatus.QUEUED.value,
            created_at=now,
            updated_at=now,
            heartbeat_at=now,
            deadline_at=deadline,
            task_ids=[],
            current_step=0,
            rearms=0,
            concurrency_key=concurrency_key,
            on_conflict=on_conflict.value if concurrency_key else None,
            claim=None,
            needs_review=False,
        )
        session.add(run)
        for index, step in enumerate(definition["steps"]):
            session.add(
                Step(
                    run_id=run_id,
                    index=index,
                    step_id=step["id"],
                    provider=step["provider"],
                    status=StepStatus.PENDING.value,
                    attempt=1,
                    idempotency_key=idempotency_key(run_id, step["id"], 1),
                    polls=0,
                    created_at=now,
                    updated_at=now,
                )
            )
        session.add(
            RunEvent(
                run_id=run_id,
                from_status=None,
                to_status=RunStatus.QUEUED.value,
                cause="launched",
                at=now,
            )
        )
        session.flush()
        if claim == claims.QUEUED:
            from orchestration.transitions import touch_run

            touch_run(session, run_id, now, claim=claims.QUEUED)
        else:
            arm(session, settings, run, now=now, dispatcher=dispatcher, claim=claim)
        return run_id


def _check_capacity(session: Session, settings: Settings, owner: str) -> None:
    live = [status.value for status in RUN_LIVE]
    total = session.scalar(select(func.count()).select_from(Run).where(Run.status.in_(live)))
    if (total or 0) >= settings.max_active_runs:
        raise LimitExceeded(
            "runs", f"{total} active runs is the limit (ORCH_MAX_ACTIVE_RUNS); retry later"
        )
    mine = session.scalar(
        select(func.count()).select_from(Run).where(Run.status.in_(live), Run.owner == owner)
    )
    if (mine or 0) >= settings.max_active_runs_per_owner:
        raise LimitExceeded(
            "runs",
            f"owner {owner!r} has {mine} active runs, the limit "
            "(ORCH_MAX_ACTIVE_RUNS_PER_OWNER); retry when some end",
        )
