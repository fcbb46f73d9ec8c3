"""What one execution tells the step task to do next."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Poll:
    """Run this step again after ``countdown`` seconds, carrying ``tick``."""

    countdown: float
    tick: int


@dataclass(frozen=True)
class Proceed:
    """The step is finished; the chain goes on."""


@dataclass(frozen=True)
class Halt:
    """Stop here and stop the chain. ``revoked``: the run ended under this execution (it
    honoured the cancel itself, or found the run terminal), so monitors are told the task
    was revoked, as they are when Celery's revoke reaches it first."""

    reason: str
    revoked: bool = False


Outcome = Poll | Proceed | Halt
