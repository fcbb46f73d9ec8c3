"""Launch: validate, write the run and its steps in one transaction, then send the chain.

The chain's first segment is planned before the rows are written and its task ids go in with
them (``chains.plan_chain``); the executor sends it after the commit. A launch is one
statement that reads the request id and the live runs' counts, then three Core inserts (the run,
its steps in one multi-row insert, the journal); on PostgreSQL, a launch that fits
(:func:`orchestration.runs.launch_statement.fits`) is first tried as one statement with no
transaction.
The record it returns is built from the rows it wrote (``Written``).
A launch onto a held concurrency key ends the holder it ousts (``concurrency.decide``) through
``closing.end_run`` in the same transaction.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Table, bindparam, case, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core import health
from orchestration.core.errors import IdempotencyConflict, ValidationError
from orchestration.core.followups import Done, Followups, Transact
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import Health
from orchestration.limits import admission, suspensions
from orchestration.runs import (
    artifacts,
    closing,
    concurrency,
    files,
    launch_evidence,
    launch_statement,
    new_rows,
)
from orchestration.workflows import agents as registered_agents
from orchestration.workflows import decoded, parsing, registry

T = TypeVar("T")

_NAME = re.compile(r"[\x21-\x7e]{1,200}")


_RUNS = cast(Table, Run.__table__)
_STEPS = cast(Table, Step.__table__)
_FOUND = (
    select(Run.id)
    .where(Run.owner == bindparam("b_owner"), Run.request_id == bindparam("b_request"))
    .scalar_subquery()
)
#: What admits a launch, in one statement built once: the run this owner's request id names
#: (and its fingerprint) or, only when there is none (``CASE`` evaluates its branch lazily),
#: the first budget with no room (:mod:`orchestration.limits.admission`), the owner's
#: suspension (:mod:`orchestration.limits.suspensions`) and the counts.
_ADMIT = select(
    _FOUND,
    select(Run.fingerprint).where(Run.id == _FOUND).scalar_subquery(),
    case((_FOUND.is_(None), admission.refused(bindparam("b_owner")))).label("refused"),
    *suspensions.held(bindparam("b_owner")),
    *admission.counts(bindparam("b_owner")),
)


def check_name(field: str, value: Any) -> str:
    """Owners, request ids and concurrency keys: 1-200 printable ASCII characters."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValidationError(field, "must be 1-200 printable ASCII characters without spaces")
    return value


@dataclass(frozen=True)
class Written:
    """The run a launch found by its request id (``steps`` is ``None``) or wrote, with the
    new step rows and its health as the SQL judged it: a new run has no branch runs and no
    reruns, so its record needs nothing else read back from the database."""

    run: Run
    steps: list[Step] | None
    health: Health | None = None


def launch(
    transact: Transact,
    settings: Settings,
    workflow: Any,
    args: Any,
    *,
    owner: str,
    request_id: str | None,
    concurrency_key: str | None,
    on_conflict: concurrency.OnConflict,
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
        once=True,
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
    on_conflict: concurrency.OnConflict,
    now: datetime,
    read: Callable[[Session, Written], T],
    reuse: new_rows.Reuse | None = None,
    version: int | None = None,
    once: bool = False,
) -> T:
    """:func:`launch`, returning what ``read`` makes of the run in the launch's own
    transaction (the Python API reads the record there: no second transaction); with
    ``reuse``, a rerun that starts at step ``reuse.first``. A ``workflow`` that is a string
    names a registered definition (``research``, ``research@3``); ``version`` is the
    registered version a definition dict is (a rerun's).

    ``once``: a launch that fits (:func:`orchestration.runs.launch_statement.fits`) may be one
    statement in autocommit; ``read`` then runs outside any transaction
    and must write nothing."""
    check_name("owner", owner)
    if isinstance(workflow, str):
        named = workflow
        found = transact(lambda session: Done(registry.resolve(session, owner, named)))
        workflow, version = found.definition, found.version
    if request_id is not None:
        check_name("request_id", request_id)
    if concurrency_key is not None:
        check_name("concurrency_key", concurrency_key)
    clean_args = parsing.check_args({} if args is None else args, settings)
    names = registered_agents.named(workflow)
    agents: dict[str, registered_agents.Entry] = {}
    if names:
        agents = transact(lambda session: Done(registered_agents.load(session, names)))
    spec = parsing.parse(workflow, settings, args=clean_args, agents=agents)
    kept = {name: entry.snapshot() for name, entry in agents.items()} or None
    steps = registered_agents.applied(spec.steps, kept)
    seen = launch_evidence.described(settings, steps, kept, now)
    definition = spec.as_dict()
    # The whole request is fingerprinted: the same request_id with another workflow, args,
    # concurrency key or conflict policy is a different request, hence a conflict.
    print_ = parsing.fingerprint(
        definition,
        clean_args,
        extra={
            "concurrency_key": concurrency_key,
            "on_conflict": on_conflict.value if concurrency_key else None,
            **({"rerun_of": reuse.rerun_of, "from": reuse.first} if reuse else {}),
        },
    )
    request = new_rows.NewRun(
        definition=definition,
        args=clean_args,
        fingerprint=print_,
        owner=owner,
        request_id=request_id or uuid.uuid4().hex,
        concurrency_key=concurrency_key,
        on_conflict=on_conflict,
        now=now,
        steps=steps,
        reuse=reuse,
        version=version,
        agents=kept,
        evidence=seen,
    )
    # The one statement writes the columns every launch has; a run with agents or evidence
    # goes through the transaction.
    plain = kept is None and not any(seen)
    if once and plain and launch_statement.fits(settings, request):
        made = transact(
            lambda session: _write_once(session, settings, request, read), autocommit=True
        )
        if made is not None:
            return made[0]
    for attempt in range(3):
        try:
            return transact(lambda session: _write(session, settings, request, read))
        except IntegrityError:
            # A concurrent launch took the same request_id or the same claim: read it again.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _write_once(
    session: Session,
    settings: Settings,
    request: new_rows.NewRun,
    read: Callable[[Session, Written], T],
) -> Done[tuple[T] | None]:
    """The launch as one statement (:mod:`orchestration.runs.launch_statement`), or the run its
    request id already names; ``None`` when it wrote nothing and found nothing, and the full
    transaction must decide."""
    run, rows, plan = new_rows.rows(settings, request, None)
    assert plan is not None
    columns = [launch_statement.set_columns(row) for row in rows]
    did = launch_statement.write(session, settings, launch_statement.set_columns(run), columns)
    if did.found is not None:
        return Done((_replay(session, request, did.found, did.fingerprint, read),))
    if not did.made:
        return Done(None)
    written = read(session, Written(run, rows, did.health))
    decoded.remember(run.id, request.steps)
    return Done((written,), Followups(chains=(plan,)))


def _replay(
    session: Session,
    request: new_rows.NewRun,
    found: str,
    fingerprint: str | None,
    read: Callable[[Session, Written], T],
) -> T:
    """The run the owner's request id already names, read for the caller; raises
    :class:`IdempotencyConflict` when it was launched with other input."""
    if fingerprint != request.fingerprint:
        raise IdempotencyConflict(request.request_id, found)
    existing = session.get(Run, found)
    assert existing is not None
    return read(session, Written(existing, None))


def _write(
    session: Session,
    settings: Settings,
    request: new_rows.NewRun,
    read: Callable[[Session, Written], T],
) -> Done[T]:
    owner, now, reuse = request.owner, request.now, request.reuse
    found, fingerprinted, refused, since, why, *counted = session.execute(
        _ADMIT,
        {"b_owner": owner, "b_request": request.request_id, **admission.limits(settings)},
    ).one()
    if found is not None:
        return Done(_replay(session, request, found, fingerprinted, read))
    if (suspended := suspensions.refusal(owner, since, why)) is not None:
        raise suspended
    if refused is not None:
        raise admission.error(refused, owner, counted)
    then = Followups()
    decision = None
    if request.concurrency_key is not None:
        decision = concurrency.decide(
            session,
            settings,
            owner=owner,
            key=request.concurrency_key,
            on_conflict=request.on_conflict,
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
    run, rows, plan = new_rows.rows(settings, request, decision)
    # Core inserts of the rows as built (the run, its steps in one multi-row insert; the
    # database journals the run): nothing is read back, so the ORM's unit of work has
    # nothing to track.
    session.execute(_RUNS.insert(), launch_statement.set_columns(run))
    session.execute(_STEPS.insert(), [launch_statement.set_columns(row) for row in rows])
    if reuse is not None:
        kept = {sha256 for k in reuse.outputs[: reuse.first] for sha256 in files.hashes(k)}
        artifacts.touch(session, owner, kept, now)
    judged = health.judge(session, settings, run.id, now)
    assert judged is not None
    written = read(session, Written(run, rows, judged.health))
    if plan is None:
        return Done(written, then)
    decoded.remember(run.id, request.steps)
    return Done(written, then + Followups(chains=(plan,)))
