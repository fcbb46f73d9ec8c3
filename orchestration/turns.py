"""Provider turns of a run's steps: the refs the engine holds, and stopping them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration import providers
from orchestration.errors import ProviderError, ValidationError
from orchestration.models import Run, Step
from orchestration.providers.base import TurnRef
from orchestration.settings import Settings
from orchestration.states import StepStatus

LOG = logging.getLogger(__name__)


def step_options(run: Run, index: int) -> dict[str, object]:
    """The ``with:`` options of step ``index`` as stored on the run."""
    options = run.workflow["steps"][index].get("with", {})
    return dict(options)


def ref_for(run: Run, step: Step) -> TurnRef:
    """How provider calls name this step's current turn."""
    assert step.idempotency_key is not None
    return TurnRef(step.idempotency_key, step.provider_run_id, step_options(run, step.index))


@dataclass(frozen=True)
class LiveTurn:
    """A turn that may be running on a provider."""

    provider: str
    ref: TurnRef


def live_turns(session: Session, run: Run) -> list[LiveTurn]:
    """Turns of the run's started, unfinished steps (a claimed start counts: the start call may
    have reached the provider even if its id was never recorded)."""
    steps = session.scalars(
        select(Step)
        .where(
            Step.run_id == run.id,
            Step.status.in_([StepStatus.RUNNING.value, StepStatus.PARKED.value]),
        )
        .execution_options(populate_existing=True)
    ).all()
    return [LiveTurn(step.provider, ref_for(run, step)) for step in steps if step.idempotency_key]


def stop(settings: Settings, turns: list[LiveTurn]) -> list[str]:
    """Ask each provider to cancel its turn; return the errors (they never block a cancel:
    the run's row is the truth, and the provider call is bounded by its timeout)."""
    errors: list[str] = []
    for turn in turns:
        try:
            providers.get_provider(turn.provider, settings).cancel(turn.ref)
        except (ProviderError, ValidationError) as exc:
            LOG.warning("provider cancel of %s failed: %s", turn.ref.key, exc)
            errors.append(f"{turn.ref.key}: {exc}")
    return errors
