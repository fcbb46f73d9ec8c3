"""The Python API's part for stopping an owner: suspend it (and cancel its live runs), resume
it, list the suspended owners and read an owner's audit; for an operator's surfaces, like
:meth:`~orchestration.service.Orchestrator.list_all`. A part of
:class:`orchestration.service.Orchestrator`; ``orchestration owners suspend|resume|suspended``
and ``/operator/owners`` make these calls (``limits/suspensions.py`` says what a suspension
refuses)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from orchestration.core.followups import Done
from orchestration.core.settings import Settings
from orchestration.limits import suspensions
from orchestration.runs import owner_cancels
from orchestration.runs.owner_cancels import Suspended
from orchestration.runtime.executor import Executor


class OwnerSuspensions:
    """Suspend, resume and read owners' suspensions; a base of ``Orchestrator``."""

    settings: Settings
    transact: Executor
    clock: Callable[[], datetime]

    def suspend_owner(
        self,
        owner: str,
        *,
        reason: str,
        by: str,
        cancel_live: bool = False,
        batch: int = owner_cancels.BATCH,
        progress: Callable[[Suspended], None] | None = None,
    ) -> Suspended:
        """Suspend ``owner``: nothing new of it is admitted (launches, reruns, schedule fires,
        registrations, answers, approvals, new fan-outs, its API tokens) until
        :meth:`resume_owner`. ``by`` names who acts in the audit and in the journal of every
        run it cancels. Idempotent: an owner already suspended keeps its first suspension
        (``new`` is ``False``). With ``cancel_live``, once the suspension committed, every live
        run of the owner is cancelled as :meth:`cancel` does (tasks revoked, provider turns
        stopped, rows terminal), ``batch`` runs read at a time, ``progress`` told the outcome
        after each batch; ``cancelled`` is how many this call ended.

        Raises :class:`ValidationError` (field ``owner`` or ``reason``: empty, or a reason over
        ``suspensions.MAX_REASON_CHARS``); nothing is then written or cancelled."""
        return owner_cancels.suspend_owner(
            self.transact,
            self.settings,
            owner,
            reason=reason,
            by=by,
            clock=self.clock,
            cancel_live=cancel_live,
            batch=batch,
            progress=progress,
        )

    def resume_owner(self, owner: str, *, by: str) -> suspensions.Suspension | None:
        """Lift ``owner``'s suspension, audited as ``by``; the suspension lifted, ``None`` when
        the owner was not suspended (nothing is written then). Fires missed meanwhile stay
        recorded as refused; runs cancelled by it stay cancelled."""
        now = self.clock()
        return self.transact(lambda session: Done(suspensions.resume(session, owner, now, by=by)))

    def suspended_owners(self) -> list[suspensions.Suspension]:
        """Every suspended owner's suspension, by owner name."""
        return self.transact(lambda session: Done(list(suspensions.current(session).values())))

    def owner_suspension(self, owner: str) -> suspensions.Suspension | None:
        """``owner``'s suspension, ``None`` when it is not suspended."""
        return self.transact(lambda session: Done(suspensions.of(session, owner)))

    def owner_events(self, owner: str, *, last: int = 20) -> list[dict[str, Any]]:
        """The latest ``last`` rows of ``owner``'s audit, newest first: ``at``, ``kind``
        (``suspended``, ``cancelled_live``, ``resumed``), ``reason``, ``by`` and ``detail``
        (``{"cancelled": N}`` for a cancel of live runs). Kept after the suspension is
        lifted."""
        return self.transact(lambda session: Done(suspensions.history(session, owner, last=last)))
