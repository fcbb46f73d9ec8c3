"""Launch: validate, write the run and its steps in one transaction, then send the chain.

The chain's first segment is planned before the rows are written and its task ids go in with
them (``chains.plan_chain``); the executor sends it after the commit. A launch is one
statement that reads the request id and counts live runs, then three Core inserts (the run,
its steps in one multi-row insert, the journal); the record it returns is built from the
rows it wrote (``Written``).
A launch onto a held concurrency key ends the holder it ousts (``claims.decide``) through
``closing.end_run`` in the same transaction.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Table, and_, bindparam, case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration import (
    artifacts,
    chains,
    claims,
    closing,
    deadlines,
    definitions,
    specs,
    step_specs,
    workflows,
)
from orchestration.errors import IdempotencyConflict, LimitExceeded, ValidationError
from orchestration.followups import Done, Followups, Transact
from orchestration.models import Run, RunEvent, Step
from orchestration.settings import Settings
from orchestration.states import RUN_LIVE, ClaimState, RunStatus, StepStatus
from orchestration.step_specs import StepSpec
from orchestration.transitions import JOURNALED

T = TypeVar("T")

_NAME = re.compile(r"[\x21-\x7e]{1,200}")


_RUNS = cast(Table, Run.__table__)
_STEPS = cast(Table, Step.__table__)
_EVENTS = cast(Table, RunEvent.__table__)
_LIVE = and_(
    Run.status.in_([status.value for status in RUN_LIVE]),
    # Branch runs are bounded by their step (ORCH_MAX_BRANCHES): they do not use up launches.
    Run.parent_run_id.is_(None),
)
_FOUND = (
    select(Run.id)
    .where(Run.owner == bindparam("b_owner"), Run.request_id == bindparam("b_request"))
    .scalar_subquery()
)
#: What admits a launch, in one statement built once: the run this owner's request id names
#: (and its fingerprint) or, only when there is none (``CASE`` evaluates its branch lazily),
#: the live runs in all and of this owner.
_ADMIT = select(
    _FOUND,
    select(Run.fingerprint).where(Run.id == _FOUND).scalar_subquery(),
    case((_FOUND.is_(None), select(func.count()).select_from(Run).where(_LIVE).scalar_subquery())),
    case(
        (
            _FOUND.is_(None),
            select(func.count())
            .select_from(Run)
            .where(_LIVE, Run.owner == bindparam("b_owner"))
            .scalar_subquery(),
        )
    ),
)


def check_name(field: str, value: Any) -> str:
    """Owners, request ids and concurrency keys: 1-200 printable ASCII characters."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValidationError(field, "must be 1-200 printable ASCII characters without spaces")
    return value


@dataclass(frozen=True)
class Reuse:
    """A rerun: the run it reruns, and the outputs of the steps before ``first`` that it
    takes from there instead of starting their turns."""

    rerun_of: str
    first: int
    #: Each reused step's output as its row keeps it (an artifact's reference included).
    outputs: tuple[artifacts.Kept, ...]


@dataclass(frozen=True)
class Written:
    """The run a launch found by its request id (``steps`` is ``None``) or wrote, with the
    new step rows: a new run has no branch runs and no reruns, so its record needs no read
    back from the database."""

    run: Run
    steps: list[Step] | None


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """The provider turn's key: at most one turn per (run, step, attempt)."""
    return f"{run_id}:{step_id}:{attempt}"


def launch(
    transact: Transact,
    settings: Settings,
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
    return launch_then(
        transact,
        settings,
        workflow,
        args,
        owner=owner,
        request_id=request_id,
        concurrency_key=concurrency_key,
        on_conflict=on_conflict,
        now=now,
        read=lambda _, written: written.run.id,
    )


def launch_then(
    transact: Transact,
    settings: Settings,
    workflow: Any,
    args: Any,
    *,
    owner: str,
    request_id: str | None,
    concurrency_key: str | None,
    on_conflict: claims.OnConflict,
    now: datetime,
    read: Callable[[Session, Written], T],
    reuse: Reuse | None = None,
    version: int | None = None,
) -> T:
    """:func:`launch`, returning what ``read`` makes of the run in the launch's own
    transaction (the Python API reads the record there: no second transaction); with
    ``reuse``, a rerun that starts at step ``reuse.first``. A ``workflow`` that is a string
    names a registered definition (``research``, ``research@3``); ``version`` is the
    registered version a definition dict is (a rerun's)."""
    check_name("owner", owner)
    if isinstance(workflow, str):
        named = workflow
        found = transact(lambda session: Done(definitions.resolve(session, owner, named)))
        workflow, version = found.definition, found.version
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
            **({"rerun_of": reuse.rerun_of, "from": reuse.first} if reuse else {}),
        },
    )
    rid = request_id or uuid.uuid4().hex
    for attempt in range(3):
        try:
            return transact(
                lambda session: _write(
                    session,
                    settings,
                    definition,
                    clean_args,
                    print_,
                    owner=owner,
                    request_id=rid,
                    concurrency_key=concurrency_key,
                    on_conflict=on_conflict,
                    now=now,
                    steps=tuple(spec.steps),
                    read=read,
                    reuse=reuse,
                    version=version,
                )
            )
        except IntegrityError:
            # A concurrent launch took the same request_id or the same claim: read it again.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _write(
    session: Session,
    settings: Settings,
    definition: dict[str, Any],
    args: dict[str, Any],
    fingerprint: str,
    *,
    owner: str,
    request_id: str,
    concurrency_key: str | None,
    on_conflict: claims.OnConflict,
    now: datetime,
    steps: tuple[StepSpec, ...],
    read: Callable[[Session, Written], T],
    reuse: Reuse | None = None,
    version: int | None = None,
) -> Done[T]:
    found, fingerprinted, total, mine = session.execute(
        _ADMIT, {"b_owner": owner, "b_request": request_id}
    ).one()
    if found is not None:
        if fingerprinted != fingerprint:
            raise IdempotencyConflict(request_id, found)
        existing = session.get(Run, found)
        assert existing is not None
        return Done(read(session, Written(existing, None)))
    _check_capacity(settings, owner, total or 0, mine or 0)
    then = Followups()
    decision = None
    if concurrency_key is not None:
        decision = claims.decide(
            session,
            settings,
            owner=owner,
            key=concurrency_key,
            on_conflict=on_conflict,
            now=now,
        )
        if decision.oust is not None:
            oust = decision.oust
            then += closing.end_run(
                session,
                settings,
                oust.run_id,
                oust.to,
                stop_reason=oust.stop_reason,
                cause=oust.cause,
                now=now,
                extra={"needs_review": True} if oust.displaced else {"cancel_requested_at": now},
                promote=False,
            )
    queued = decision is not None and decision.claim is ClaimState.QUEUED
    run_id = uuid.uuid4().hex
    # The first segment's task ids go in with the rows (what ``chains.arm`` would store): a
    # queued run gets its segment when it is given the claim.
    first = reuse.first if reuse else 0
    plan = None if queued else chains.plan_chain(run_id, first, len(steps))
    task_of = {link.index: link.task_id for link in plan.links} if plan else {}
    deadline = (
        claims.queued_deadline(settings, decision.holder_deadline, now)
        if decision is not None and queued
        else deadlines.compute(settings, RunStatus.QUEUED, heartbeat_at=now)
    )
    run = Run(
        id=run_id,
        owner=owner,
        request_id=request_id,
        fingerprint=fingerprint,
        workflow_name=definition["name"],
        workflow_version=version,
        workflow=definition,
        args=args,
        status=RunStatus.QUEUED.value,
        created_at=now,
        updated_at=now,
        heartbeat_at=now,
        deadline_at=deadline,
        task_ids=plan.task_ids if plan else [],
        current_step=first,
        rearms=0,
        rerun_of=reuse.rerun_of if reuse else None,
        concurrency_key=concurrency_key,
        on_conflict=on_conflict.value if concurrency_key else None,
        claim=decision.claim.value if decision is not None else None,
        needs_review=False,
    )
    rows = [
        new_step(
            run_id,
            index,
            step,
            now,
            task_id=task_of.get(index),
            reused=reuse.outputs[index] if reuse is not None and index < first else None,
        )
        for index, step in enumerate(definition["steps"])
    ]
    events = [
        queued_event(
            run_id, f"rerun of {reuse.rerun_of} from step {first}" if reuse else "launched", now
        ),
        *(
            RunEvent(
                run_id=run_id,
                step_id=definition["steps"][index]["id"],
                from_status=None,
                to_status=StepStatus.COMPLETED.value,
                cause=f"output reused from run {reuse.rerun_of if reuse else '?'}",
                at=now,
            )
            for index in range(first)
        ),
    ]
    # Core inserts of the rows as built (the run, its steps in one multi-row insert, the
    # journal): nothing is read back, so the ORM's unit of work has nothing to track.
    session.execute(_RUNS.insert(), _set_columns(run))
    session.execute(_STEPS.insert(), [_set_columns(row) for row in rows])
    session.execute(_EVENTS.insert(), [_journal_row(event) for event in events])
    if reuse is not None:
        artifacts.touch(session, owner, {k.sha256 for k in reuse.outputs[:first] if k.sha256}, now)
    written = read(session, Written(run, rows))
    if plan is None:
        return Done(written, then)
    specs.remember(run_id, steps)
    return Done(written, then + Followups(chains=(plan,)))


def new_step(
    run_id: str,
    index: int,
    step: dict[str, Any],
    now: datetime,
    *,
    task_id: str | None,
    reused: artifacts.Kept | None = None,
) -> Step:
    """A new run's step row from its stored spec: pending, or ``completed`` with the output
    a rerun reuses (``reused``)."""
    return Step(
        run_id=run_id,
        index=index,
        step_id=step["id"],
        provider=step_specs.provider_column(step),
        status=(StepStatus.COMPLETED if reused is not None else StepStatus.PENDING).value,
        attempt=1,
        idempotency_key=idempotency_key(run_id, step["id"], 1),
        polls=0,
        output=reused.value if reused is not None else None,
        output_sha256=reused.sha256 if reused is not None else None,
        finished_at=now if reused is not None else None,
        celery_task_id=task_id,
        created_at=now,
        updated_at=now,
    )


def queued_event(run_id: str, cause: str, now: datetime) -> RunEvent:
    """The journal's first row of a new run."""
    return RunEvent(
        run_id=run_id, from_status=None, to_status=RunStatus.QUEUED.value, cause=cause, at=now
    )


def _set_columns(row: Run | Step | RunEvent) -> dict[str, Any]:
    """The columns a new row object was given, by column name (what the ORM would insert);
    every step of a launch is given the same ones."""
    given = vars(row)
    columns = row.__table__.columns
    return {column.key: given[column.key] for column in columns if column.key in given}


def _journal_row(event: RunEvent) -> dict[str, Any]:
    """A journal row's columns, all of them (one executemany takes the keys of its first)."""
    return {name: getattr(event, name) for name in JOURNALED}


def _check_capacity(settings: Settings, owner: str, total: int, mine: int) -> None:
    if total >= settings.max_active_runs:
        raise LimitExceeded(
            "runs", f"{total} active runs is the limit (ORCH_MAX_ACTIVE_RUNS); retry later"
        )
    if mine >= settings.max_active_runs_per_owner:
        raise LimitExceeded(
            "runs",
            f"owner {owner!r} has {mine} active runs, the limit "
            "(ORCH_MAX_ACTIVE_RUNS_PER_OWNER); retry when some end",
        )
