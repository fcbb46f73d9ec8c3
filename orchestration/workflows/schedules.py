"""A definition's ``schedule:``: when the beat launches it by itself, with what args, and what
a fire does while the previous run still lives (the shape of Temporal schedules and
celery-director's periodic workflows).

Cron has minute resolution; ``every: N`` (seconds, aligned on the Unix epoch so every beat
computes the same instants) is the form for shorter periods. Fire times are computed here,
with no I/O, from a start instant: :func:`fires_after`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings

#: The longest catch-up window (seven days): older missed fires are recorded as skipped.
MAX_CATCHUP_WINDOW = 7 * 86400
#: The shortest ``every`` (seconds) the model takes; registration also refuses one shorter
#: than ``ORCH_SCHEDULE_INTERVAL`` (:func:`check`).
MIN_EVERY = 1
MAX_EVERY = 366 * 86400


class Overlap(StrEnum):
    """What a fire does while the run of an earlier fire of the same schedule is live."""

    #: Recorded ``skipped``; nothing is launched.
    SKIP = "skip"
    #: Launched anyway: the runs overlap.
    ENQUEUE = "enqueue"
    #: The live run is cancelled (as ``orchestration cancel`` does), then the fire launches.
    CANCEL_PREVIOUS = "cancel_previous"


class ScheduleSpec(BaseModel):
    """``schedule:``: exactly one of ``cron`` (five fields, in ``timezone``) or ``every``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cron: str | None = Field(None, max_length=200)
    every: int | None = Field(None, ge=MIN_EVERY, le=MAX_EVERY)
    #: An IANA zone (``Europe/Paris``): the zone the cron fields are read in.
    timezone: str = "UTC"
    #: The args of every launch; checked against the definition's ``args_schema``.
    args: dict[str, Any] = Field(default_factory=dict)
    overlap: Overlap = Overlap.SKIP
    #: Seconds a missed fire may be late and still be launched.
    catchup_window: int = Field(3600, ge=0, le=MAX_CATCHUP_WINDOW)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(
                f"{value!r} is not a five-field cron expression (minute hour day month "
                "weekday); for a period in seconds use 'every: N'"
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not a known IANA time zone (e.g. UTC)") from None
        return value

    @model_validator(mode="after")
    def _one_form(self) -> ScheduleSpec:
        if (self.cron is None) == (self.every is None):
            raise ValueError("a schedule has exactly one of cron or every (seconds)")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The stored form: the unused one of ``cron`` / ``every`` is left out."""
        data = self.model_dump(mode="json")
        return {key: value for key, value in data.items() if value is not None}


def check(spec: ScheduleSpec, settings: Settings) -> None:
    """Refuse, naming the field and the setting, an ``every`` shorter than the beat's pass
    interval: it could only fire in bursts, late, and one owner's storm of them would take
    every pass (issue 30)."""
    if spec.every is not None and spec.every < settings.schedule_interval:
        raise ValidationError(
            "schedule.every",
            f"{spec.every}s is shorter than ORCH_SCHEDULE_INTERVAL "
            f"({settings.schedule_interval:g}s), how often the beat fires schedules; "
            f"use every: {math.ceil(settings.schedule_interval)} or more",
        )


def next_after(spec: ScheduleSpec, at: datetime) -> datetime:
    """The schedule's first fire instant strictly after ``at``."""
    return next(fires_after(spec, at))


def fires_after(spec: ScheduleSpec, start: datetime) -> Iterator[datetime]:
    """The schedule's fire instants strictly after ``start``, in UTC, in order (endless)."""
    if spec.every is not None:
        step = spec.every
        at = (int(start.timestamp()) // step + 1) * step
        while True:
            yield datetime.fromtimestamp(at, UTC)
            at += step
    it = croniter(spec.cron, start.astimezone(ZoneInfo(spec.timezone)))
    while True:
        yield it.get_next(datetime).astimezone(UTC)


def next_fires(spec: ScheduleSpec, start: datetime, count: int) -> list[datetime]:
    """The first ``count`` fire instants after ``start`` (``schedules list``)."""
    found = fires_after(spec, start)
    return [next(found) for _ in range(count)]
