"""Every table, as SQLAlchemy 2 models: runs, steps, the journal, the effects outbox,
checkpoints, artifacts, registered definitions, schedule fires and pauses, API tokens, the
sweeper's liveness row, the fleet's samples, pruned runs' counts, live runs' and live turns'
counts, owners' inline output bytes, owners' deletions of runs, owner suspensions with their
audit, and the operator's agent registry. The Alembic migrations in
``orchestration/migrations`` create exactly these (``tests/unit/test_migrations_match_models.py``
compares them)."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from orchestration.core.states import RUN_LIVE, ConcurrencyState, RunStatus, StepStatus

E = TypeVar("E", bound=StrEnum)

#: JSON on SQLite, JSONB on PostgreSQL.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class StateColumn(TypeDecorator[E], Generic[E]):
    """A status column: stored as its string, read back as the enum of ``states``, so a row's
    status is never a bare string in the code."""

    impl = String(20)
    cache_ok = True

    def __init__(self, enum: type[E]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum(value)


_LIVE_SQL = "status IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(RUN_LIVE)))


class Base(DeclarativeBase):
    """The declarative base of every table, so one metadata holds the whole schema."""


class Run(Base):
    """One workflow run. A status change is checked and journaled by the database
    (:mod:`orchestration.core.status_triggers`)."""

    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("owner", "request_id", name="uq_runs_owner_request"),
        Index("ix_runs_owner_created", "owner", "created_at"),
        # Partial index: the sweeper and the limits touch only live runs, so their cost grows
        # with live runs and not with history. No column a poll stamps (heartbeat, deadline,
        # current step) is in any index of this table: a poll's stamp is then a HOT update,
        # which writes no index entry (the sweeper reads every live row anyway).
        Index(
            "ix_runs_live",
            "status",
            postgresql_where=text(_LIVE_SQL),
            sqlite_where=text(_LIVE_SQL),
        ),
        # At most one holder per concurrency key, enforced by the database itself.
        Index(
            "uq_runs_claim_holder",
            "owner",
            "concurrency_key",
            unique=True,
            postgresql_where=text("concurrency = 'holding'"),
            sqlite_where=text("concurrency = 'holding'"),
        ),
        Index(
            "ix_runs_live_claim",
            "owner",
            "concurrency_key",
            "created_at",
            postgresql_where=text(_LIVE_SQL + " AND concurrency_key IS NOT NULL"),
            sqlite_where=text(_LIVE_SQL + " AND concurrency_key IS NOT NULL"),
        ),
        # Cheap reads (issue 10): a list filtered by status, or by a live health, reads only
        # the rows it returns; /metrics counts from indexes, never from the event journal.
        Index("ix_runs_owner_status_created", "owner", "status", "created_at"),
        Index(
            "ix_runs_owner_live",
            "owner",
            "created_at",
            postgresql_where=text(_LIVE_SQL),
            sqlite_where=text(_LIVE_SQL),
        ),
        Index(
            "ix_runs_finished",
            "finished_at",
            "status",
            "stop_reason",
            postgresql_where=text("finished_at IS NOT NULL"),
            sqlite_where=text("finished_at IS NOT NULL"),
        ),
        # A step's branches are created once each, and read in branch order.
        Index(
            "uq_runs_branch",
            "parent_run_id",
            "parent_step",
            "branch",
            unique=True,
            postgresql_where=text("parent_run_id IS NOT NULL"),
            sqlite_where=text("parent_run_id IS NOT NULL"),
        ),
        Index(
            "ix_runs_cancel_latency",
            "finished_at",
            "cancel_requested_at",
            postgresql_where=text("status = 'cancelled'"),
            sqlite_where=text("status = 'cancelled'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    request_id: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))
    workflow_name: Mapped[str] = mapped_column(String(200))
    #: The registered definition's version it runs (``None``: launched from a file).
    workflow_version: Mapped[int | None] = mapped_column(Integer)
    workflow: Mapped[dict[str, Any]] = mapped_column(JSONType)
    args: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[RunStatus] = mapped_column(StateColumn(RunStatus))
    #: Why the run is in its status: the latest change's cause, which the journal copies.
    cause: Mapped[str | None] = mapped_column(Text)
    stop_reason: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: Set when ``result`` is an artifact's reference (``{sha256, size, media_type}``).
    result_sha256: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Every Celery task id this run ever owned (the launch chain and every re-dispatch).
    task_ids: Mapped[list[str]] = mapped_column(JSONType, default=list)
    #: Index of the step the run is on.
    current_step: Mapped[int] = mapped_column(Integer, default=0)
    #: Times the sweeper re-dispatched a run whose heartbeat died.
    rearms: Mapped[int] = mapped_column(Integer, default=0)
    park_reason: Mapped[str | None] = mapped_column(String(40))
    parked_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    waiting_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    concurrency_key: Mapped[str | None] = mapped_column(String(200))
    on_conflict: Mapped[str | None] = mapped_column(String(20))
    #: ``holding`` while this run holds its concurrency key, ``queued`` while it waits behind
    #: the holder (``on_conflict=enqueue``), ``None`` otherwise.
    concurrency: Mapped[ConcurrencyState | None] = mapped_column(StateColumn(ConcurrencyState))
    #: Set when a human should look at this run (e.g. displaced from its concurrency key).
    needs_review: Mapped[bool] = mapped_column(default=False)
    #: A branch run: the run whose ``for_each`` or ``parallel`` step made it, that step's
    #: index, the branch's position, and its key (the item's index, or the parallel step id).
    parent_run_id: Mapped[str | None] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE", name="fk_runs_parent_run_id_runs"),
        nullable=True,
    )
    parent_step: Mapped[int | None] = mapped_column(Integer)
    branch: Mapped[int | None] = mapped_column(Integer)
    branch_key: Mapped[str | None] = mapped_column(String(80))
    #: A rerun: the run whose completed steps' outputs it reused.
    rerun_of: Mapped[str | None] = mapped_column(String(32), index=True)
    #: What a branch's templates see beside ``args``: ``{item, index, steps}`` (the parent's
    #: completed outputs when the branch was made).
    branch_context: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: The registry entries its ``agent:`` steps name, as they were at launch (``{name:
    #: {provider, url, secret, options, pin}}``): the run calls what it was launched with.
    #: Never shown to the owner (a record has no such field).
    agents: Mapped[Any] = mapped_column(JSONType, nullable=True)

    # Loaded only when read: the step task reads its run several times per execution and
    # never needs the other steps (eager loading them showed in its profile, docs/benchmarks).
    steps: Mapped[list[Step]] = relationship(
        back_populates="run", order_by="Step.index", lazy="select"
    )


class Step(Base):
    """One step of a run. A status change is checked and journaled by the database
    (:mod:`orchestration.core.status_triggers`)."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("run_id", "index", name="uq_steps_run_index"),
        Index(
            "ix_steps_output_sha256",
            "output_sha256",
            postgresql_where=text("output_sha256 IS NOT NULL"),
            sqlite_where=text("output_sha256 IS NOT NULL"),
        ),
    )

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    step_id: Mapped[str] = mapped_column(String(80))
    provider: Mapped[str] = mapped_column(String(80))
    status: Mapped[StepStatus] = mapped_column(StateColumn(StepStatus))
    #: Why the step is in its status: the latest change's cause, which the journal copies.
    cause: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    provider_run_id: Mapped[str | None] = mapped_column(String(200))
    input: Mapped[Any] = mapped_column(JSONType, nullable=True)
    output: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: Set when ``output`` is an artifact's reference (``{sha256, size, media_type}``): the
    #: output was over ``ORCH_INLINE_OUTPUT_BYTES`` and lives in the artifact store.
    output_sha256: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    #: Executions of the step task so far; also the fencing token that makes a duplicate
    #: delivery of the same message a no-op (see ``stepper``).
    polls: Mapped[int] = mapped_column(Integer, default=0)
    last_provider_status: Mapped[str | None] = mapped_column(String(200))
    #: What the provider asked the human (for ``input_required``).
    prompt: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: The human's answer that the current attempt resumes with (``answer``).
    answer: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: The turn that asked for that answer, ``{key, provider_run_id}``: a runtime whose ids
    #: it makes itself (an MCP task and its session) is found again only through it.
    asked_turn: Mapped[Any] = mapped_column(JSONType, nullable=True)
    celery_task_id: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(String(200))
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    next_poll_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: The provider cancel of this step's turn once the run ended it, or of the previous
    #: attempt's turn when a retry ended it: ``{status, attempts, error, at, key,
    #: provider_run_id}`` (status a :class:`~orchestration.core.states.TurnStopStatus`; ``key``
    #: names the turn, an earlier attempt's for a retry), else ``None``.
    turn_stop: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: When the current execution claimed the provider start (cleared once the call's outcome
    #: is recorded): ``cancel`` waits for a live claim, bounded by one provider call.
    start_claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: A ``retrying`` step's next attempt starts no earlier than this (its ``retry`` backoff).
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: The attempts this step has ended and retried, oldest first: ``{attempt, reason, error,
    #: provider_run_id, started_at, ended_at}`` each.
    past_attempts: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: What the step's agent said of itself (:class:`~orchestration.providers.base.Evidence`):
    #: ``{launch: {...}, start: {...}}``, each ``{name, version, detail, at}`` or ``{error,
    #: at}``; ``None`` for a step whose provider does not describe itself.
    evidence: Mapped[Any] = mapped_column(JSONType, nullable=True)

    run: Mapped[Run] = relationship(back_populates="steps")


class RunEvent(Base):
    """The journal: one row per status change of a run or one of its steps, written by the
    database's triggers (:mod:`orchestration.core.status_triggers`), never by the code."""

    __tablename__ = "run_events"
    __table_args__ = (Index("ix_run_events_run", "run_id", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    #: ``None`` for a run transition, the step id for a step transition.
    step_id: Mapped[str | None] = mapped_column(String(80))
    from_status: Mapped[str | None] = mapped_column(String(20))
    to_status: Mapped[str] = mapped_column(String(20))
    cause: Mapped[str] = mapped_column(Text)
    stop_reason: Mapped[str | None] = mapped_column(String(40))
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class Effect(Base):
    """A post-step effect in the transactional outbox (checkpoint capture, webhook)."""

    __tablename__ = "effects"
    __table_args__ = (
        UniqueConstraint("run_id", "step_index", "attempt", "kind", name="uq_effects_step_kind"),
        Index("ix_effects_run", "run_id", "status"),
    )

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step_index: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[Any] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Checkpoint(Base):
    """What the checkpoint effect captured after a finished turn."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step_index", "attempt", name="uq_checkpoints"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step_index: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    state: Mapped[Any] = mapped_column(JSONType, nullable=True)
    captured_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Artifact(Base):
    """An output too big to keep in its step's row, stored once per owner by its sha256.

    The key includes the owner: knowing a hash never reads another owner's artifact. The
    bytes are in ``content``, or (``ORCH_ARTIFACT_DIR``) in a file named by the hash, shared
    by every owner that stored the same bytes; ``used_at`` is stamped at every store, so a
    prune never deletes one that a live run has just referenced."""

    __tablename__ = "artifacts"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(100))
    content: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    used_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WorkflowDefinition(Base):
    """A registered workflow: ``name@version`` of one owner (``""``: published for every
    owner by an operator), its validated definition and that definition's sha256."""

    __tablename__ = "workflow_definitions"
    __table_args__ = (
        UniqueConstraint("owner", "name", "version", name="uq_workflow_definitions_version"),
        Index("ix_workflow_definitions_hash", "owner", "name", "sha256"),
    )

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    definition: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SweeperBeat(Base):
    """The sweeper's liveness: one row per sweeper name, stamped at every pass."""

    __tablename__ = "sweeper_beats"

    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    last_pass_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_pass_seconds: Mapped[float] = mapped_column()
    last_report: Mapped[dict[str, Any]] = mapped_column(JSONType)
    passes: Mapped[int] = mapped_column(Integer, default=0)


class ApiToken(Base):
    """One token: who it acts as, a label, and when it stopped working."""

    __tablename__ = "api_tokens"
    __table_args__ = (Index("ix_api_tokens_owner", "owner"),)

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: An operator's token: reads and cancels every owner's runs on ``/operator``, acts as
    #: no owner (``owner`` is ``""``, which no owner can be) and is named in every journal row
    #: it writes.
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class FleetSample(Base):
    """What one source saw of one series over one period (a minute, or one sweep pass)."""

    __tablename__ = "fleet_samples"
    __table_args__ = (Index("ix_fleet_samples_at", "at"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    series: Mapped[str] = mapped_column(String(40))
    #: Who measured: ``host:pid`` for a worker process, the sweeper's name for a pass.
    source: Mapped[str] = mapped_column(String(200))
    #: The start of the period (a minute's first instant, or the pass's time).
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    count: Mapped[int] = mapped_column(Integer)
    total: Mapped[float] = mapped_column(Float)
    largest: Mapped[float] = mapped_column(Float)
    #: Counts per bucket of :data:`orchestration.upkeep.fleet_series.BUCKETS`, the unbounded
    #: one last.
    buckets: Mapped[Any] = mapped_column(JSONType)


class PrunedRuns(Base):
    """Runs a prune deleted that finished in ``hour`` with this status, stop reason and
    cancel-latency bucket."""

    __tablename__ = "pruned_runs"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    status: Mapped[str] = mapped_column(String(32), primary_key=True)
    stop_reason: Mapped[str] = mapped_column(String(40), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    #: The summed cancel latency of these runs (0 for :data:`NO_LATENCY`).
    latency_seconds: Mapped[float] = mapped_column(Float)


class LiveRunCount(Base):
    """A part of ``owner``'s count of live runs, branch runs included (of all owners', for
    :data:`TOTAL`): the count is the sum of its slots."""

    __tablename__ = "live_run_counts"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    live: Mapped[int] = mapped_column(Integer)


class InlineOutputBytes(Base):
    """A part of ``owner``'s bytes of outputs kept inline in their steps' rows (the length of
    each output's JSON as the database stores it), kept by triggers on ``steps`` and ``runs``
    (migration 0023): the bytes are the sum of its slots."""

    __tablename__ = "inline_output_bytes"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)


class LiveTurnCount(Base):
    """A part of ``owner``'s count of live provider turns (steps ``running`` with a turn or a
    start claimed), kept by triggers on ``steps`` (migration 0024): the sum of its slots."""

    __tablename__ = "live_turn_counts"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    live: Mapped[int] = mapped_column(Integer)


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


class RunDeletion(Base):
    """One run its owner deleted (``orchestration delete``, ``DELETE /runs/{id}``): what it
    was, when and through what, for an operator to read once the run's rows are gone."""

    __tablename__ = "run_deletions"
    __table_args__ = (Index("ix_run_deletions_deleted", "deleted_at"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(32))
    owner: Mapped[str] = mapped_column(String(200))
    #: ``name@version`` of a registered definition, else the workflow's name.
    workflow: Mapped[str] = mapped_column(String(220))
    status: Mapped[str] = mapped_column(String(20))
    deleted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: Through what the owner deleted it: ``api`` (with the token's name) or ``cli``.
    by: Mapped[str] = mapped_column(String(200))
    #: The run's branch runs that went with it.
    branch_runs: Mapped[int] = mapped_column(Integer, default=0)


class OwnerSuspension(Base):
    """A suspended owner: while the row exists its launches, schedule fires, registrations,
    answers, approvals and API tokens are refused (``orchestration owners suspend``)."""

    __tablename__ = "owner_suspensions"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    suspended_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text)
    #: Who suspended it (``operator NAME`` or the CLI's user).
    by: Mapped[str] = mapped_column(String(200))


class OwnerEvent(Base):
    """The audit of what operators did to an owner: each suspend and resume, with why and by
    whom (a suspension's row goes when it is resumed; this stays)."""

    __tablename__ = "owner_events"
    __table_args__ = (Index("ix_owner_events_owner", "owner", "at"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: ``suspended``, ``resumed`` or ``cancelled_live`` (the count in ``detail``).
    kind: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    by: Mapped[str] = mapped_column(String(200))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)


class Agent(Base):
    """An agent the operator registered (``orchestration agents add``): a step names it
    (``agent: NAME``) instead of a provider and a URL."""

    __tablename__ = "agents"

    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    #: ``a2a``, ``mcp``, ``langgraph`` or ``http``.
    provider: Mapped[str] = mapped_column(String(40))
    url: Mapped[str] = mapped_column(Text)
    #: The name of the secret its calls carry (declared in ``ORCH_PROVIDER_SECRETS``).
    secret: Mapped[str | None] = mapped_column(String(200))
    #: Default ``with:`` options of the steps that name it.
    options: Mapped[dict[str, Any]] = mapped_column(JSONType)
    #: Every step that names it is pinned (``pin: true``).
    pin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ScheduleEntry(Base):
    """A registered schedule: the latest version of an owner's definition that carries one,
    and the instant of its next fire (``NULL`` while paused). The beat's pass selects the due
    ones by that column instead of reading every definition; a fire moves it on."""

    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedules_next_fire", "next_fire_at"),)

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    next_fire_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class StopSlot(Base):
    """One of an owner's ``ORCH_STOP_TURNS_PER_OWNER`` slots for a provider cancel in flight:
    the slot number is part of the key, so an owner never holds more than that many."""

    __tablename__ = "stop_slots"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    step_index: Mapped[int] = mapped_column(Integer)
    taken_at: Mapped[datetime] = mapped_column(UTCDateTime())


class OwnerBudget(Base):
    """An operator's own values of one owner's budgets (``orchestration owners set``); a
    ``NULL`` column is the setting's value (``orchestration.limits.admission``)."""

    __tablename__ = "owner_budgets"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    max_active_runs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_live_turns: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_definitions: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_stored_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
