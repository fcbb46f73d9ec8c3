"""Post-step effects through a transactional outbox.

When a turn finishes, its effects (a checkpoint capture of the turn into the database, and a
webhook when ``ORCH_WEBHOOK_URL`` is set) are written as rows in the same transaction that
records the output and moves the run to ``waiting``. The step task then runs the due ones,
each with bounded attempts and doubling backoff. An effect that exhausts its attempts never
leaves the run ``waiting``: under ``ORCH_EFFECT_POLICY=fail`` the run fails
(``effect_failed``); under ``continue`` the failure stays on the effect row and the run goes on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import httpx
from sqlalchemy import Insert, Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from orchestration import providers
from orchestration.core import pieces
from orchestration.core.db import insert_spelled
from orchestration.core.egress import entry_for, host_port
from orchestration.core.errors import ProviderError
from orchestration.core.followups import Done, Transact
from orchestration.core.models import Checkpoint, Effect, Run, Step
from orchestration.core.pieces import Piece
from orchestration.core.settings import Settings
from orchestration.core.states import EffectStatus
from orchestration.limits import bounds
from orchestration.providers.base import TurnRef
from orchestration.providers.exchange import allow_list, exchange
from orchestration.runs import turns

CHECKPOINT = "checkpoint"

_CHECKPOINTS = cast(Table, Checkpoint.__table__)
_EFFECTS = cast(Table, Effect.__table__)
_OUTBOX_COLUMNS = (
    "run_id",
    "step_index",
    "attempt",
    "kind",
    "attempts",
    "max_attempts",
    "created_at",
    "updated_at",
    "status",
    "last_error",
    "next_attempt_at",
)
#: Built once (a step that finishes pays for binding, not building): an inline checkpoint's
#: outbox row.
_EFFECT_ROW = (
    insert(_EFFECTS)
    .values({name: bindparam(f"e_{name}", type_=_EFFECTS.c[name].type) for name in _OUTBOX_COLUMNS})
    .returning(_EFFECTS.c.pk)
)


@functools.lru_cache(maxsize=2)
def _checkpoint_once(dialect: str) -> Insert:
    """The checkpoint of a step attempt, stored once (built once per database spelling)."""
    statement: Insert = (
        insert_spelled(dialect, _CHECKPOINTS)
        .values(
            run_id=bindparam("run_id"),
            step_index=bindparam("step_index"),
            attempt=bindparam("attempt"),
            state=bindparam("state", type_=_CHECKPOINTS.c.state.type),
            captured_at=bindparam("at", type_=_CHECKPOINTS.c.captured_at.type),
        )
        .on_conflict_do_nothing()
        .returning(_CHECKPOINTS.c.pk)
    )
    return statement


@functools.lru_cache(maxsize=2)
def _captured(dialect: str) -> tuple[Piece, Piece]:
    """A captured checkpoint: its outbox row and the checkpoint (:mod:`orchestration.core.pieces`:
    on PostgreSQL, one statement)."""
    return Piece("outbox", _EFFECT_ROW), Piece("checkpoint", _checkpoint_once(dialect))


WEBHOOK = "webhook"


def enqueue(session: Session, settings: Settings, step: Step, *, now: datetime) -> None:
    """Write the step's effects into the outbox (idempotent per step attempt and kind)."""
    kinds = [CHECKPOINT] + ([WEBHOOK] if settings.webhook_url else [])
    for kind in kinds:
        exists = session.scalar(
            select(Effect.pk).where(
                Effect.run_id == step.run_id,
                Effect.step_index == step.index,
                Effect.attempt == step.attempt,
                Effect.kind == kind,
            )
        )
        if exists is None:
            session.add(
                Effect(
                    run_id=step.run_id,
                    step_index=step.index,
                    attempt=step.attempt,
                    kind=kind,
                    status=EffectStatus.PENDING.value,
                    attempts=0,
                    max_attempts=settings.effect_attempts,
                    next_attempt_at=now,
                    created_at=now,
                    updated_at=now,
                )
            )
    session.flush()


def for_step(session: Session, run_id: str, index: int, attempt: int) -> list[Effect]:
    """The outbox rows of one step attempt."""
    return list(
        session.scalars(
            select(Effect).where(
                Effect.run_id == run_id, Effect.step_index == index, Effect.attempt == attempt
            )
        ).all()
    )


@dataclass(frozen=True)
class Progress:
    """Where a step's effects stand after a pass."""

    settled: bool
    exhausted: list[str]
    next_due: datetime | None


def run_due(
    transact: Transact, settings: Settings, run_id: str, index: int, attempt: int, now: datetime
) -> Progress:
    """Run every due effect of the step attempt once; report where they stand."""
    due = transact(
        lambda session: Done(
            [
                (effect.pk, effect.kind, effect.attempts)
                for effect in for_step(session, run_id, index, attempt)
                if effect.status == EffectStatus.PENDING and effect.next_attempt_at <= now
            ]
        )
    )
    for pk, kind, attempts in due:
        _attempt(transact, settings, pk, kind, attempts, run_id, index, attempt, now)
    return transact(lambda session: Done(progress(session, run_id, index, attempt)))


def progress(session: Session, run_id: str, index: int, attempt: int) -> Progress:
    """Where the effects of one step attempt stand."""
    rows = for_step(session, run_id, index, attempt)
    pending = [e for e in rows if e.status == EffectStatus.PENDING]
    return Progress(
        settled=not pending,
        exhausted=[
            f"{e.kind} effect failed {e.attempts} times: {e.last_error}"
            for e in rows
            if e.status == EffectStatus.EXHAUSTED
        ],
        next_due=min((e.next_attempt_at for e in pending), default=None),
    )


def inline(settings: Settings) -> bool:
    """Whether a finished turn's effects run in the execution that saw it finish, before the
    transaction that completes the step: the checkpoint alone (a read of the provider) may;
    a webhook goes through the outbox, so that an execution that lost its fence cannot post."""
    return settings.webhook_url is None


def capture(settings: Settings, provider_name: str, ref: TurnRef) -> tuple[Any, str | None]:
    """One checkpoint attempt, outside any transaction: the state (redacted and bounded) and
    the error, if any."""
    try:
        state = providers.get_provider(provider_name, settings).snapshot(ref)
    except (ProviderError, httpx.HTTPError, ValueError) as exc:
        return None, bounds.error_text(str(exc) or type(exc).__name__, settings)
    state = bounds.json_value(state, settings)
    return state, bounds.over(
        state, settings.max_output_bytes, "the checkpoint", "ORCH_MAX_OUTPUT_BYTES"
    )


def record_capture(
    session: Session,
    settings: Settings,
    step: Step,
    captured: tuple[Any, str | None],
    now: datetime,
) -> Progress:
    """Write an inline checkpoint attempt as its outbox row (done, or pending with its backoff
    for the effects phase to retry, or exhausted) and say where the effects stand: this row
    is the step attempt's only effect (no webhook is configured, see :func:`inline`)."""
    state, error = captured
    values = _after_attempt(settings, 0, error, now)
    outbox = {
        "run_id": step.run_id,
        "step_index": step.index,
        "attempt": step.attempt,
        "kind": CHECKPOINT,
        "attempts": 1,
        "max_attempts": settings.effect_attempts,
        "created_at": now,
        "updated_at": now,
        **values,
    }
    row = {f"e_{name}": value for name, value in outbox.items()}
    if error is None:
        checkpoint = {"run_id": step.run_id, "step_index": step.index, "attempt": step.attempt}
        pieces.send(
            session,
            _captured(session.get_bind().dialect.name),
            {**row, **checkpoint, "state": state, "at": now},
        )
        return Progress(settled=True, exhausted=[], next_due=None)
    session.execute(_EFFECT_ROW, row)
    if values["status"] == EffectStatus.EXHAUSTED.value:
        return Progress(
            settled=True, exhausted=[f"{CHECKPOINT} effect failed 1 times: {error}"], next_due=None
        )
    return Progress(settled=False, exhausted=[], next_due=values["next_attempt_at"])


def _after_attempt(
    settings: Settings, attempts: int, error: str | None, now: datetime
) -> dict[str, Any]:
    """An effect row's status, error and next attempt after attempt number ``attempts + 1``."""
    if error is None:
        return {"status": EffectStatus.DONE.value, "last_error": None, "next_attempt_at": now}
    exhausted = attempts + 1 >= settings.effect_attempts
    # Capped so a waiting run's next stamp never outlasts the heartbeat timeout.
    backoff = min(
        settings.effect_backoff * (2 ** min(attempts, 30)), settings.max_poll_interval_limit
    )
    return {
        "status": (EffectStatus.EXHAUSTED if exhausted else EffectStatus.PENDING).value,
        "last_error": error,
        "next_attempt_at": now + timedelta(seconds=backoff),
    }


def _attempt(
    transact: Transact,
    settings: Settings,
    pk: int,
    kind: str,
    attempts: int,
    run_id: str,
    index: int,
    attempt: int,
    now: datetime,
) -> None:
    # Claim the attempt (compare-and-set on the count): a duplicate execution skips it.
    claimed = transact(lambda session: Done(_claim(session, pk, attempts, run_id, index, now)))
    if claimed is None:
        return
    provider_name, ref, payload = claimed
    error: str | None = None
    state: Any = None
    if kind == CHECKPOINT:
        state, error = capture(settings, provider_name, ref)
    else:
        try:
            _post_webhook(settings, payload)
        except (ProviderError, httpx.HTTPError, ValueError) as exc:
            error = bounds.error_text(str(exc) or type(exc).__name__, settings)
    values = _after_attempt(settings, attempts, error, now)
    if error is None:
        del values["next_attempt_at"]

    def settle(session: Session) -> Done[None]:
        if error is None and kind == CHECKPOINT:
            _store_checkpoint(session, run_id, index, attempt, state, now)
        session.execute(
            update(Effect)
            .where(Effect.pk == pk, Effect.status == EffectStatus.PENDING.value)
            .values(updated_at=now, **values)
        )
        return Done(None)

    transact(settle)


def _claim(
    session: Session, pk: int, attempts: int, run_id: str, index: int, now: datetime
) -> tuple[str, TurnRef, dict[str, Any]] | None:
    claimed = session.execute(
        update(Effect)
        .where(
            Effect.pk == pk,
            Effect.attempts == attempts,
            Effect.status == EffectStatus.PENDING.value,
        )
        .values(attempts=attempts + 1, updated_at=now)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        return None
    run = session.get(Run, run_id)
    step = session.scalars(select(Step).where(Step.run_id == run_id, Step.index == index)).one()
    assert run is not None
    payload = {
        "run_id": run_id,
        "owner": run.owner,
        "step_id": step.step_id,
        "attempt": step.attempt,
        "output": step.output,
    }
    return step.provider, turns.ref_for(session, step), payload


def _store_checkpoint(
    session: Session, run_id: str, index: int, attempt: int, state: Any, now: datetime
) -> None:
    """Store the checkpoint once per step attempt: a second capture of the same attempt (a
    retried effect whose first success was not recorded) is a no-op."""
    session.execute(
        _checkpoint_once(session.get_bind().dialect.name),
        {"run_id": run_id, "step_index": index, "attempt": attempt, "state": state, "at": now},
    )


def _post_webhook(settings: Settings, payload: dict[str, Any]) -> None:
    """POST ``payload`` to the operator's URL within ``ORCH_WEBHOOK_TIMEOUT``, DNS to last
    byte, like a provider call. Its own host and port are allowed on top of
    ``ORCH_PROVIDER_HOSTS`` (the operator wrote them; a name of it that resolves to a
    metadata or link-local address is still refused unless listed). A redirect or a non-2xx
    answer raises ``ProviderError``; no retry within the call once the request was sent (the
    outbox retries)."""
    url = settings.webhook_url
    assert url is not None
    found = host_port(url)
    if found is None:
        raise ValueError(f"ORCH_WEBHOOK_URL {url!r} is not an http(s) URL")
    allow = allow_list(settings).including(entry_for(*found))
    with exchange(settings, bound=settings.webhook_timeout, allow=allow) as http:
        http.send(
            "POST",
            url,
            what="webhook",
            json_body=payload,
            accept=range(200, 300),
            repeatable=False,
        )
