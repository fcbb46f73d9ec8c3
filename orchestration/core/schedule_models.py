"""The rows of schedules: one per fire (its unique key is what makes a fire happen once,
whatever number of beats pass over it) and one per paused schedule."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.core.models import Base, UTCDateTime


class FireStatus(StrEnum):
    """What became of one fire."""

    #: A run was launched (``run_id``).
    LAUNCHED = "launched"
    #: Not launched: older than the catch-up window, or ``overlap: skip`` met a live run.
    SKIPPED = "skipped"
    #: The launch was refused (``reason``: the error, e.g. a limit); not retried.
    FAILED = "failed"


class ScheduleFire(Base):
    """One fire of the schedule of an owner's definition ``name``, recorded once."""

    __tablename__ = "schedule_fires"
    #: Also the index of "the latest fire of a schedule" (the pass's cursor).
    __table_args__ = (UniqueConstraint("owner", "name", "fire_at", name="uq_schedule_fires_fire"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    #: The definition version the fire launched (or would have).
    version: Mapped[int] = mapped_column(Integer)
    fire_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16))
    request_id: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SchedulePause(Base):
    """A paused schedule: while the row exists its fires are neither recorded nor launched."""

    __tablename__ = "schedule_pauses"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    paused_at: Mapped[datetime] = mapped_column(UTCDateTime())
