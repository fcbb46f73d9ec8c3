"""The Python API for web apps: launch, get, list, cancel, answer, explain, delete, schedules;
owner-scoped. An operator's calls (every owner's runs, suspending an owner) take no owner.

    from orchestration.service import Orchestrator
    orch = Orchestrator.from_env()
    run = orch.launch(workflow_dict, {"topic": "x"}, owner="acme", request_id="req-1")
    orch.cancel(run.id, owner="acme")

Every call takes the owner; another owner's run is reported as not found (invariant 7).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core import health as judgement
from orchestration.core.db import check_ready, utcnow
from orchestration.core.errors import BrokerUnavailable, RunNotFound, ValidationError
from orchestration.core.followups import Done
from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings, get_settings
from orchestration.core.states import RUN_TERMINAL, RunStatus
from orchestration.limits import suspensions
from orchestration.observability import tracing
from orchestration.owner_suspensions import OwnerSuspensions
from orchestration.reads import owned, summaries
from orchestration.reads.records import RunRecord, to_record
from orchestration.reads.summaries import RunSummary
from orchestration.registered import RegisteredWorkflows
from orchestration.run_actions import RunActions
from orchestration.runs import artifacts, concurrency, launching, reruns
from orchestration.runtime import readiness
from orchestration.runtime.celery_queue import client_queue
from orchestration.runtime.executor import Executor, TaskQueue, Unsent

#: Most runs one ``list`` call returns.
MAX_PAGE = 500


class Orchestrator(RunActions, RegisteredWorkflows, OwnerSuspensions):
    """Owner-scoped operations on runs: reads and launches here; cancel, answer, approve and
    delete from :class:`RunActions`; registered workflows and schedules from
    :class:`RegisteredWorkflows`; an operator's suspension of an owner from
    :class:`OwnerSuspensions`. Thread-safe; cheap to build."""

    transact: Executor

    def __init__(
        self,
        settings: Settings,
        queue: TaskQueue | None,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        #: Every write goes through it: one transaction, then the chain sent, the tasks
        #: revoked and the provider stops handed off (``None``: nothing is sent).
        self.transact = Executor(settings, queue)
        self.clock = clock

    @classmethod
    def from_env(cls) -> Orchestrator:
        """Settings from ``ORCH_*``, sending through the configured broker. Raises
        :class:`DatabaseNotReady` when the schema is not there (a SQLite file that does not
        exist is never created)."""
        settings = get_settings()
        readiness.require_database(settings.database_url)
        check_ready(settings.database_url)
        tracing.setup(settings, "orchestration")
        return cls(settings, client_queue(settings))

    # -- reads -----------------------------------------------------------------------------
    def get(self, run_id: str, *, owner: str) -> RunRecord:
        """The run record. Raises :class:`RunNotFound` (also for another owner's run)."""
        return self._record(run_id, owner)

    def list(
        self,
        *,
        owner: str,
        status: str | None = None,
        health: str | None = None,
        limit: int = 50,
        before: datetime | None = None,
    ) -> builtins.list[RunSummary]:
        """The owner's runs as summaries (no workflow, args, result or step payloads), newest
        first; ``before`` (a ``created_at``) pages back. ``get`` gives a run's full record.

        Raises :class:`ValidationError` for an unknown status or health, or ``limit`` outside
        1..``MAX_PAGE``.
        """
        return self.list_all(owner=owner, status=status, health=health, limit=limit, before=before)

    def list_all(
        self,
        *,
        owner: str | None,
        status: str | None = None,
        health: str | None = None,
        limit: int = 50,
        before: datetime | None = None,
        top_level: bool = False,
    ) -> builtins.list[RunSummary]:
        """:meth:`list` across owners (``owner=None``): for the operator's surfaces only.
        ``top_level`` leaves branch runs out and counts each run's branches (the dashboard)."""
        summaries.check_filters(status, health, limit, MAX_PAGE)
        now = self.clock()
        return self.transact(
            lambda session: Done(
                summaries.listing(
                    session,
                    self.settings,
                    owner=owner,
                    now=now,
                    status=status,
                    health=health,
                    limit=limit,
                    before=before,
                    top_level=top_level,
                )
            )
        )

    def explain(self, run_id: str, *, owner: str) -> dict[str, Any]:
        """Why the run is where it is, what moves it next and its ``deadline_at``; a next move
        that waits for a sweeper that has not passed, or for a worker when none consuming the
        run queue answers, says so."""
        from orchestration.reads.explain import Around, explain
        from orchestration.runtime import broker_probe, liveness

        now = self.clock()

        def read(session: Session) -> Done[tuple[RunRecord, judgement.Judged, str | None]]:
            # The record's health and the judgement are one statement's, at one instant: a run
            # whose heartbeat dies between two clocks would read stalled with no sweeper rule
            # owning it.
            run, judged = owned.owned_judged(session, self.settings, run_id, owner, now)
            record = owned.record(session, self.settings, run, now, judged)
            return Done((record, judged, suspensions.note(session, owner, run.cause)))

        record, judged, suspension = self.transact(read)
        sending = self.transact.queue is not None
        around = Around(
            liveness.sweeper_liveness(self.settings, now).doubt,
            lambda: broker_probe.workers_doubt(self.settings) if sending else None,
            lambda: broker_probe.upkeep_doubt(self.settings) if sending else None,
        )
        return explain(self.settings, record, judged, now, around, suspension=suspension)

    def events(self, run_id: str, *, owner: str) -> builtins.list[dict[str, Any]]:
        """The run's journal, oldest first."""
        return self.transact(lambda session: Done(owned.journal(session, run_id, owner)))

    def output(self, run_id: str, step_id: str, *, owner: str) -> artifacts.Output:
        """A step's output, inline or as its verified artifact (see :meth:`artifact_bytes`).
        Raises :class:`RunNotFound`, :class:`ValidationError` for an unknown step, and
        :class:`~orchestration.core.errors.ArtifactCorrupt` when the stored bytes changed."""

        def read(session: Session) -> Done[artifacts.Output]:
            run = owned.owned(session, run_id, owner)
            step = session.scalars(
                select(Step).where(Step.run_id == run.id, Step.step_id == step_id)
            ).first()
            if step is None:
                raise ValidationError("step", f"run {run_id} has no step {step_id!r}")
            return Done(artifacts.step_output(session, self.settings, owner, step))

        return self.transact(read)

    def artifact(self, sha256: str, *, owner: str) -> dict[str, Any]:
        """An artifact of ``owner`` by its hash (a file an output names, or an output over
        ``ORCH_INLINE_OUTPUT_BYTES``): its ``{sha256, size, media_type}`` once its bytes
        check against the hash, to stream with :meth:`artifact_bytes`. Raises
        :class:`~orchestration.core.errors.ArtifactNotFound` (another owner's too) and
        :class:`~orchestration.core.errors.ArtifactCorrupt` when the stored bytes changed."""

        def read(session: Session) -> Done[dict[str, Any]]:
            row = artifacts.meta(session, owner, sha256)
            artifacts.verify(session, self.settings, row)
            return Done(artifacts.ref(row.sha256, row.size, row.media_type))

        return self.transact(read)

    def artifact_bytes(self, sha256: str, *, owner: str) -> Iterator[bytes]:
        """The bytes of an artifact of ``owner``, a chunk per short transaction."""
        return artifacts.stream(
            lambda read: self.transact(lambda session: Done(read(session))),
            self.settings,
            owner,
            sha256,
        )

    # -- writes ----------------------------------------------------------------------------
    def launch(
        self,
        workflow: Any,
        args: Any = None,
        *,
        owner: str,
        request_id: str | None = None,
        concurrency_key: str | None = None,
        on_conflict: str = "reject",
    ) -> RunRecord:
        """Validate, write the run and its steps in one transaction, send the step chain.

        Idempotent per (owner, request_id): the same request returns the existing run.
        Raises :class:`ValidationError` / :class:`LimitExceeded` for bad input (nothing is
        written), :class:`IdempotencyConflict` for a reused request_id with other input,
        :class:`ConflictError` for a held concurrency key under ``on_conflict='reject'``, and
        :class:`BrokerUnavailable` (its ``run_id`` the saved run) when the run was written but
        the broker did not take its chain: the sweeper sends it once the broker is back, and
        the same request_id returns it.
        """
        try:
            policy = concurrency.OnConflict(on_conflict)
        except ValueError:
            raise ValidationError(
                "on_conflict", f"must be one of {[p.value for p in concurrency.OnConflict]}"
            ) from None
        started, now, unsent = time.time_ns(), self.clock(), list[Unsent]()
        record = launching.launch_then(
            self.transact.reporting(unsent),
            self.settings,
            workflow,
            args,
            owner=owner,
            request_id=request_id,
            concurrency_key=concurrency_key,
            on_conflict=policy,
            now=now,
            read=self._launched,
            once=True,
        )
        return _sent(_traced_launch(record, started, now, owner=owner), unsent)

    def rerun(
        self,
        run_id: str,
        *,
        owner: str,
        from_step: str | None = None,
        request_id: str | None = None,
    ) -> RunRecord:
        """Launch a new run of an ended run's workflow and args that reuses the outputs of the
        steps before ``from_step`` (default: its first step that did not complete) and runs
        the rest. Idempotent per (owner, request_id). Raises :class:`ConflictError` for a live
        or completed run, :class:`ValidationError` for an unknown step or one that follows a
        step that did not complete."""
        source = self.transact(lambda session: Done(reruns.source(session, run_id, owner)))
        reuse = reruns.plan(source, from_step)
        started, now, unsent = time.time_ns(), self.clock(), list[Unsent]()
        record = launching.launch_then(
            self.transact.reporting(unsent),
            self.settings,
            source.workflow,
            source.args,
            owner=owner,
            request_id=request_id,
            concurrency_key=source.concurrency_key,
            on_conflict=concurrency.OnConflict(source.on_conflict or "reject"),
            now=now,
            read=self._launched,
            reuse=reuse,
            version=source.workflow_version,
        )
        return _sent(_traced_launch(record, started, now, owner=owner, rerun_of=run_id), unsent)

    def owner_of(self, run_id: str) -> str:
        """The owner of ``run_id`` (the operator's surfaces act as it). Raises
        :class:`RunNotFound`."""

        def read(session: Session) -> Done[str]:
            owner = session.scalar(select(Run.owner).where(Run.id == str(run_id)[:64]))
            if owner is None:
                raise RunNotFound(str(run_id)[:64])
            return Done(owner)

        return self.transact(read)

    # -- helpers ---------------------------------------------------------------------------
    def _launched(self, session: Session, written: launching.Written) -> RunRecord:
        """The record of the run a launch found (read) or wrote (from the rows it wrote)."""
        now = self.clock()
        if written.steps is None:
            return owned.record(session, self.settings, written.run, now)
        assert written.health is not None
        return to_record(self.settings, written.run, written.steps, now, health=written.health)


def _sent(record: RunRecord, unsent: builtins.list[Unsent]) -> RunRecord:
    """The launched run's record; :class:`BrokerUnavailable` naming it when the broker did
    not take its chain (the run is saved: the sweeper sends it once the broker is back)."""
    for failed in unsent:
        if failed.run_id == record.id:
            raise BrokerUnavailable(
                failed.error.broker, failed.error.cause, run_id=record.id
            ) from failed.error
    return record


def _traced_launch(record: RunRecord, started: int, now: datetime, **attributes: Any) -> RunRecord:
    """The launch span of a run this call created (not of one its request id found)."""
    if record.created_at == now:
        tracing.launch(record.id, started, workflow=record.workflow_name, **attributes)
    return record


def is_terminal(record: RunRecord) -> bool:
    """Whether a record's status is terminal."""
    return RunStatus(record.status) in RUN_TERMINAL
