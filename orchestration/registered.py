"""The Python API's part for registered workflows and their schedules (``name@version``,
``schedule:``): owner-scoped, like the rest of :class:`orchestration.service.Orchestrator`,
which it is a part of."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from orchestration.core.followups import Done, Transact
from orchestration.core.settings import Settings
from orchestration.upkeep import schedule_controls
from orchestration.workflows import registry


class RegisteredWorkflows:
    """Registered definitions and their schedules; a base of ``Orchestrator``."""

    settings: Settings
    transact: Transact
    clock: Callable[[], datetime]

    def workflows(self, *, owner: str) -> list[registry.Definition]:
        """The owner's registered definitions and the published ones, newest first."""
        return self.transact(lambda session: Done(registry.listed(session, owner)))

    def workflow(self, ref: str, *, owner: str) -> registry.Definition:
        """The definition ``ref`` (``name`` or ``name@version``) names for ``owner``."""
        return self.transact(lambda session: Done(registry.resolve(session, owner, ref)))

    def schedules(self, *, owner: str) -> list[dict[str, Any]]:
        """The owner's schedules by name: the next fire times (none while paused: a paused
        schedule fires nothing), the pause, and the latest fires with the runs they made
        (datetimes as ISO text; see :func:`schedule_controls.listing`)."""
        now = self.clock()
        found = self.transact(lambda session: Done(schedule_controls.listing(session, owner, now)))
        return [{**one, "next_fires": []} if one["paused"] else one for one in found]

    def register_workflow(
        self, data: Any, *, owner: str, shared: bool = False
    ) -> tuple[registry.Definition, bool]:
        """Store ``data`` as the next version of its name (the same content: the version it
        already is), and whether it is new. Raises :class:`ValidationError` naming the field."""
        now = self.clock()
        return self.transact(
            lambda session: Done(
                registry.register(session, self.settings, owner, data, now, shared=shared)
            )
        )

    def pause_schedule(self, name: str, *, owner: str) -> bool:
        """Pause the owner's schedule ``name`` (its fires are neither recorded nor launched);
        whether it was running. Raises :class:`ValidationError` (field ``name``) when the
        owner has no such schedule, another owner's included."""
        now = self.clock()
        return self.transact(
            lambda session: Done(schedule_controls.pause(session, owner, name, now))
        )

    def resume_schedule(self, name: str, *, owner: str) -> bool:
        """Resume it; whether it was paused. The fires missed meanwhile follow the catch-up
        rules at the next pass. Raises :class:`ValidationError` as :meth:`pause_schedule`."""
        return self.transact(lambda session: Done(schedule_controls.resume(session, owner, name)))
