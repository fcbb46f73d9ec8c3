"""The Python API's part for acting on one run that exists: cancel it, answer or decide what it
waits for, delete it once ended; owner-scoped, like the rest of
:class:`orchestration.service.Orchestrator`, which it is a part of."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from orchestration.core import ownership
from orchestration.core.errors import LimitExceeded, ValidationError
from orchestration.core.followups import Done
from orchestration.core.settings import Settings
from orchestration.core.states import StopReason
from orchestration.execution import approving
from orchestration.observability import context
from orchestration.reads import owned
from orchestration.reads.records import RunRecord
from orchestration.runs import answers, cancellation, deletion
from orchestration.runtime.executor import Executor
from orchestration.upkeep import retention


class Cancellation(NamedTuple):
    """What a cancel did: the run's record after it, and whether it changed anything
    (``False``: the run had already ended; nothing was cancelled)."""

    record: RunRecord
    changed: bool


class RunActions:
    """Cancel, answer, approve and delete an owner's run; a base of ``Orchestrator``."""

    settings: Settings
    transact: Executor
    clock: Callable[[], datetime]

    def cancel(
        self, run_id: str, *, owner: str, graceful: bool = False, by: str | None = None
    ) -> RunRecord:
        """Cancel the run. Returns the terminal ``cancelled`` record (or the run unchanged if it
        had already ended). With ``graceful``, only the request is recorded: the step honours
        it at its next execution, and the sweeper enforces it after ``ORCH_CANCEL_GRACE``.
        ``by`` names who asked in the journal (default: the owner)."""
        return self.cancel_run(run_id, owner=owner, graceful=graceful, by=by).record

    def cancel_run(
        self, run_id: str, *, owner: str, graceful: bool = False, by: str | None = None
    ) -> Cancellation:
        """:meth:`cancel`, saying also whether it changed anything (``False``: the run had
        already ended, and nothing was cancelled)."""
        ownership.checked(run_id)
        with context.acting(run_id, "run.cancel", owner=owner, graceful=graceful):
            requested = cancellation.request(
                self.transact,
                self.settings,
                run_id,
                now=self.clock(),
                by=by or f"owner {owner}",
                stop=not graceful,
                owner=owner,
            )
            if requested is not None and not graceful:
                cancellation.finish(
                    self.transact,
                    self.settings,
                    run_id,
                    now=self.clock(),
                    stop_reason=StopReason.CANCEL_REQUESTED,
                    cause=f"cancelled by {by}" if by else "cancelled by the caller",
                    revoke=True,
                    live=requested.live,
                )
        return Cancellation(self._record(run_id, owner), changed=requested is not None)

    def answer(self, run_id: str, step_id: str, value: Any, *, owner: str) -> RunRecord:
        """Resume a ``human`` park: the step starts a new attempt with ``value`` as the answer.

        Raises :class:`ConflictError` when the run is not parked for a human at that step.
        """
        try:
            encoded = json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValidationError("value", f"must be plain JSON: {exc}") from None
        if len(encoded) > self.settings.max_args_bytes:
            raise LimitExceeded(
                "value",
                f"{len(encoded)} bytes is over ORCH_MAX_ARGS_BYTES "
                f"({self.settings.max_args_bytes})",
            )
        now = self.clock()
        self.transact(
            lambda session: answers.resume(
                session, self.settings, owned.owned(session, run_id, owner), step_id, value, now
            )
        )
        return self._record(run_id, owner)

    def approve(
        self,
        run_id: str,
        step_id: str,
        *,
        owner: str,
        approve: bool = True,
        comment: str | None = None,
    ) -> RunRecord:
        """Decide the approval step ``step_id``: approved, the run moves on; rejected, it ends
        ``failed`` (``approval_rejected``). Raises :class:`ConflictError` when the run is not
        waiting for that decision (decided already, expired, cancelled, or another step)."""
        limit = approving.MAX_COMMENT_CHARS
        if comment is not None and (not isinstance(comment, str) or len(comment) > limit):
            raise ValidationError("comment", f"must be text of at most {limit} characters")
        now = self.clock()

        def decide(session: Session) -> Done[None]:
            owned.owned(session, run_id, owner)
            then = approving.decide(
                session,
                self.settings,
                run_id,
                step_id,
                approve=approve,
                comment=comment,
                by=owner,
                now=now,
            )
            return Done(None, then)

        self.transact(decide)
        return self._record(run_id, owner)

    def delete(self, run_id: str, *, owner: str, by: str = "python") -> deletion.Deletion:
        """Delete the owner's ended run with its branch runs, its journal and the artifacts
        nothing else references, and record the deletion for operators (``by`` says through
        what: ``python``, ``dashboard``, ``api``, ``cli (user)``). The same domain call as
        ``orchestration delete`` and ``DELETE /runs/{id}``.

        Raises :class:`RunNotFound` (also for another owner's run) and :class:`ConflictError`,
        its message saying why and what to do, for a live run, a branch run or a run still
        cleaning up (that one succeeds when tried again, :mod:`orchestration.runs.deletion`).
        """
        return retention.delete_run(
            self.transact, self.settings, run_id, owner=owner, by=by, now=self.clock()
        )

    def _record(self, run_id: str, owner: str) -> RunRecord:
        """The record of the owner's run now, in a transaction of its own."""
        return self.transact(lambda session: Done(self._read(session, run_id, owner)))

    def _read(
        self, session: Session, run_id: str, owner: str, now: datetime | None = None
    ) -> RunRecord:
        """The record of the owner's run at ``now`` (default: now). Raises
        :class:`RunNotFound`."""
        now = now or self.clock()
        run, judged = owned.owned_judged(session, self.settings, run_id, owner, now)
        return owned.record(session, self.settings, run, now, judged)
