"""Post-step effects through a transactional outbox.

When a turn finishes, its effects (a checkpoint capture of the turn into the database, and a
webhook when ``ORCH_WEBHOOK_URL`` is set) are written as rows in the same transaction that
records the output and moves the run to ``waiting``. The step task then runs the due ones,
each with bounded attempts and doubling backoff. An effect that exhausts its attempts never
leaves the run ``waiting``: under ``ORCH_EFFECT_POLICY=fail`` the run fails
(``effect_failed``); under ``continue`` the failure stays on the effect row and the run goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration import bounds, providers, turns
from orchestration.db import session_scope
from orchestration.egress import entry_for, host_port
from orchestration.errors import ProviderError
from orchestration.models import Checkpoint, Effect, Run, Step
from orchestration.providers.http import allow_list, exchange
from orchestration.settings import Settings
from orchestration.states import EffectStatus

LOG = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
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


def run_due(settings: Settings, run_id: str, index: int, attempt: int, now: datetime) -> Progress:
    """Run every due effect of the step attempt once; report where they stand."""
    with session_scope(settings.database_url) as session:
        due = [
            (effect.pk, effect.kind, effect.attempts)
            for effect in for_step(session, run_id, index, attempt)
            if effect.status == EffectStatus.PENDING and effect.next_attempt_at <= now
        ]
    for pk, kind, attempts in due:
        _attempt(settings, pk, kind, attempts, run_id, index, attempt, now)
    with session_scope(settings.database_url) as session:
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


def _attempt(
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
    with session_scope(settings.database_url) as session:
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
            return
        run = session.get(Run, run_id)
        step = session.scalars(select(Step).where(Step.run_id == run_id, Step.index == index)).one()
        assert run is not None
        ref = turns.ref_for(run, step)
        payload = {
            "run_id": run_id,
            "owner": run.owner,
            "step_id": step.step_id,
            "attempt": attempt,
            "output": step.output,
        }
        provider_name = step.provider
    error: str | None = None
    state: Any = None
    try:
        if kind == CHECKPOINT:
            state = providers.get_provider(provider_name, settings).snapshot(ref)
        else:
            _post_webhook(settings, payload)
    except (ProviderError, httpx.HTTPError, ValueError) as exc:
        error = bounds.error_text(str(exc) or type(exc).__name__, settings)
    if error is None and kind == CHECKPOINT:
        # The snapshot is what a provider returned: redacted and bounded like an output.
        state = bounds.json_value(state, settings)
        error = bounds.over(
            state, settings.max_output_bytes, "the checkpoint", "ORCH_MAX_OUTPUT_BYTES"
        )
    with session_scope(settings.database_url) as session:
        if error is None:
            if kind == CHECKPOINT:
                _store_checkpoint(session, run_id, index, attempt, state, now)
            values: dict[str, Any] = {"status": EffectStatus.DONE.value, "last_error": None}
        else:
            exhausted = attempts + 1 >= settings.effect_attempts
            # Capped so a waiting run's next stamp never outlasts the heartbeat timeout.
            backoff = min(
                settings.effect_backoff * (2 ** min(attempts, 30)), settings.max_poll_interval_limit
            )
            values = {
                "status": (EffectStatus.EXHAUSTED if exhausted else EffectStatus.PENDING).value,
                "last_error": error,
                "next_attempt_at": now + timedelta(seconds=backoff),
            }
        session.execute(
            update(Effect)
            .where(Effect.pk == pk, Effect.status == EffectStatus.PENDING.value)
            .values(updated_at=now, **values)
        )


def _store_checkpoint(
    session: Session, run_id: str, index: int, attempt: int, state: Any, now: datetime
) -> None:
    try:
        with session.begin_nested():
            session.add(
                Checkpoint(
                    run_id=run_id, step_index=index, attempt=attempt, state=state, captured_at=now
                )
            )
    except IntegrityError:
        LOG.info("checkpoint of %s step %s attempt %s already stored", run_id, index, attempt)


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
