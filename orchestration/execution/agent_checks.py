"""What a step's agent says of itself before its turn starts, and the pin that acts on it.

Each start asks the agent (``providers.evidence.observe``, inside the start's own bound), and
the step keeps the answer as its ``start`` evidence. A pinned step (``pin: true``, or its
registry entry's ``pin``) starts only on the version recorded at launch: another one fails
the run ``agent_changed``, an agent that cannot say waits as an outage (or fails, when it
refuses), and the turn is never started on an agent the pin does not allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core.followups import Done, Transact
from orchestration.core.models import Step
from orchestration.core.settings import Settings
from orchestration.execution.entry import Entry
from orchestration.providers import evidence


@dataclass(frozen=True)
class Checked:
    """What asking the agent came to: the evidence to keep, and why the turn may not start
    now (an outage), or at all (a refusal; the agent changed)."""

    seen: dict[str, Any] | None = None
    outage: str | None = None
    refused: str | None = None
    changed: str | None = None

    def kept(self, before: Mapping[str, Any] | None) -> dict[str, Any]:
        """The step's ``evidence`` column with this start's evidence in it (``{}`` when
        there is none to write)."""
        if self.seen is None:
            return {}
        return {"evidence": {**(before or {}), "start": self.seen}}


def _launch_evidence(session: Session, pk: int) -> Any:
    found = session.scalar(select(Step.evidence).where(Step.pk == pk))
    return found.get("launch") if isinstance(found, dict) else None


def before_start(
    settings: Settings,
    transact: Transact,
    entry: Entry,
    provider: str,
    options: Mapping[str, Any],
    now: datetime,
) -> Checked:
    """Ask the step's agent what it is; for a pinned step, compare with its launch."""
    seen = evidence.observe(settings, provider, options, now)
    if seen is None or not entry.spec.pin:
        return Checked(seen)
    step = entry.step.step_id
    if "error" in seen:
        said = f"step {step} is pinned, and its agent's version could not be read: {seen['error']}"
        return Checked(seen, outage=said) if seen.get("retryable") else Checked(seen, refused=said)
    pk = entry.step.pk
    launch = transact(lambda session: Done(_launch_evidence(session, pk)), autocommit=True)
    changed = evidence.changed(launch, seen)
    return Checked(seen, changed=None if changed is None else f"step {step}: {changed}")
