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
    """Stop here and stop the chain."""

    reason: str


Outcome = Poll | Proceed | Halt
