"""The run page's time axis: each step's phases drawn as bars, on the server, as SVG.

A phase is the time a step spent in one status, from the journal row that entered it to the
next one (or to the step's end, or to now while the run lives): ``running`` is the start and
its polls, ``parked`` a park (a human, an approval, an outage, its branches), ``waiting`` the
run's effects after the turn, ``retrying`` the backoff before the next attempt. A live step's
next poll (``next_poll_at``) is drawn as a tick, so a long countdown stands out. A branching
step's branch runs get a row each under it, one bar from the branch's start to its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestration.core.states import STEP_TERMINAL
from orchestration.reads.records import RunRecord

#: Geometry of the drawing (SVG user units).
WIDTH, LABEL, ROW, BAR = 720, 120, 22, 14
#: Terminal step statuses end a step's last phase; they are not phases themselves.
_ENDS = frozenset(status.value for status in STEP_TERMINAL)


@dataclass(frozen=True)
class Phase:
    """One bar: a step in one status from ``start`` to ``end``, at ``x``, ``width`` wide."""

    step_id: str
    row: int
    status: str
    start: datetime
    end: datetime
    x: float
    width: float

    @property
    def title(self) -> str:
        seconds = (self.end - self.start).total_seconds()
        return f"{self.step_id}: {self.status} for {seconds:.2f}s from {self.start.isoformat()}"


@dataclass(frozen=True)
class Timeline:
    """What the template draws."""

    start: datetime
    end: datetime
    phases: list[Phase]
    #: ``(row, x, when)`` of each live step's next poll.
    countdowns: list[tuple[int, float, datetime]]
    steps: list[str]
    height: int

    def ticks(self, count: int = 5) -> list[tuple[float, str, str]]:
        """``count`` + 1 axis labels: ``(x, seconds since the start, text-anchor)``."""
        span = (self.end - self.start).total_seconds()
        digits = 2 if span < 10 else 1 if span < 100 else 0
        return [
            (
                LABEL + (WIDTH - LABEL) * i / count,
                f"{span * i / count:.{digits}f}s",
                "end" if i == count else "middle",
            )
            for i in range(count + 1)
        ]


def build(record: RunRecord, events: list[dict[str, Any]], now: datetime) -> Timeline:
    """The phases of each of ``record``'s steps from its journal (``events``, oldest first)."""
    start = record.created_at
    end = record.finished_at or now
    span = max((end - start).total_seconds(), 1e-3)

    def x_of(when: datetime) -> float:
        offset = min(max((when - start).total_seconds(), 0.0), span)
        return LABEL + (WIDTH - LABEL) * offset / span

    steps: list[str] = []
    rows: dict[str, int] = {}
    branch_rows: list[tuple[int, dict[str, Any]]] = []
    for step in record.steps:
        rows[step.step_id] = len(steps)
        steps.append(step.step_id)
        for branch in step.branches or []:
            branch_rows.append((len(steps), branch))
            steps.append(f"  [{branch['id']}]")
    entered: dict[str, list[tuple[str, datetime]]] = {step.step_id: [] for step in record.steps}
    for event in events:
        if event["step_id"] in entered:
            entered[event["step_id"]].append((event["to"], event["at"]))
    phases = []
    for step in record.steps:
        changes = entered[step.step_id]
        # A step that has not started yet has no journal row, and no phase.
        following_each = [*changes[1:], None][: len(changes)]
        for (status, since), following in zip(changes, following_each, strict=True):
            if status in _ENDS or status == "pending":
                continue
            until = following[1] if following else (step.finished_at or end)
            x = x_of(since)
            phases.append(
                Phase(
                    step.step_id,
                    rows[step.step_id],
                    status,
                    since,
                    until,
                    x,
                    max(x_of(until) - x, 1.0),
                )
            )
    for row, branch in branch_rows:
        if branch["started_at"] is None:
            continue
        since, until = branch["started_at"], branch["finished_at"] or end
        x = x_of(since)
        phases.append(
            Phase(
                steps[row].strip(),
                row,
                branch["status"],
                since,
                until,
                x,
                max(x_of(until) - x, 1.0),
            )
        )
    countdowns = [
        (rows[step.step_id], x_of(step.next_poll_at), step.next_poll_at)
        for step in record.steps
        if step.next_poll_at is not None and step.status not in _ENDS and record.finished_at is None
    ]
    return Timeline(start, end, phases, countdowns, steps, ROW * len(steps) + 24)
