"""Registered workflow definitions: ``name@version`` per owner, each validated once and kept
with its content hash, so that two runs of ``research@3`` run the same program.

Registering the content a name already has (any of its versions) is a no-op that returns that
version; changed content gets the next version. An operator may publish a definition for
every owner (owner ``""``, which no tenant can be: owners are 1-200 characters); a launch by
name looks in the owner's own definitions first, then in the published ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestration.core.errors import ValidationError
from orchestration.core.models import WorkflowDefinition
from orchestration.core.settings import Settings
from orchestration.limits import admission, suspensions
from orchestration.workflows import agents, parsing, schedule_rows

#: The owner of the definitions an operator publishes for every owner.
SHARED = ""
#: ``research`` (the latest version) or ``research@3``.
REFERENCE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,199})(?:@([1-9][0-9]{0,8}))?")


@dataclass(frozen=True)
class Definition:
    """One registered version, as callers see it."""

    name: str
    version: int
    sha256: str
    shared: bool
    definition: dict[str, Any]
    created_at: datetime

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def summary(self) -> dict[str, Any]:
        """What ``workflows list`` and ``GET /workflows`` show (no definition body)."""
        return {
            "ref": self.ref,
            "name": self.name,
            "version": self.version,
            "sha256": self.sha256,
            "shared": self.shared,
            "steps": len(self.definition["steps"]),
            "args_schema": self.definition.get("args_schema"),
            "created_at": self.created_at.isoformat(),
        }


def _of(row: WorkflowDefinition) -> Definition:
    return Definition(
        row.name, row.version, row.sha256, row.owner == SHARED, row.definition, row.created_at
    )


def content_hash(definition: dict[str, Any]) -> str:
    """The sha256 of a validated definition's canonical JSON (key order does not count)."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def register(
    session: Session, settings: Settings, owner: str, data: Any, now: datetime, *, shared: bool
) -> tuple[Definition, bool]:
    """Validate ``data`` and store it as the next version of its name (``shared``: for every
    owner); the stored version and whether it is new. Raises :class:`ValidationError`
    naming the field for a bad definition, or a name that cannot be referred to, and
    :class:`OwnerSuspended` for a suspended owner, and :class:`LimitExceeded` for a new
    version past the owner's ``ORCH_MAX_DEFINITIONS_PER_OWNER`` (every version counts: each is
    a stored program)."""
    suspensions.refuse(session, owner)
    known = agents.load(session, agents.named(data))
    definition = parsing.parse(data, settings, agents=known).as_dict()
    name = definition["name"]
    if not REFERENCE.fullmatch(name) or "@" in name:
        raise ValidationError(
            "name", "must be letters, digits, '_', '.' or '-' (and start with one of the first two)"
        )
    if shared and "schedule" in definition:
        # A schedule launches as an owner; a published definition has none to run as.
        raise ValidationError(
            "schedule", "a shared definition cannot carry a schedule; register it as an owner's"
        )
    if not shared:
        schedule_rows.admit(session, settings, owner, definition)
    scope = SHARED if shared else owner
    sha256 = content_hash(definition)
    for _ in range(3):
        same = session.scalars(
            select(WorkflowDefinition).where(
                WorkflowDefinition.owner == scope,
                WorkflowDefinition.name == name,
                WorkflowDefinition.sha256 == sha256,
            )
        ).first()
        if same is not None:
            return _of(same), False
        if not shared:
            admission.check(session, settings, owner, (admission.DEFINITIONS,))
        latest = session.scalar(
            select(func.max(WorkflowDefinition.version)).where(
                WorkflowDefinition.owner == scope, WorkflowDefinition.name == name
            )
        )
        row = WorkflowDefinition(
            owner=scope,
            name=name,
            version=(latest or 0) + 1,
            sha256=sha256,
            definition=definition,
            created_at=now,
        )
        try:
            with session.begin_nested():  # a concurrent register took the version: look again
                session.add(row)
        except IntegrityError:
            continue
        if not shared:
            schedule_rows.registered(session, owner, name, row.version, definition, now)
        return _of(row), True
    raise ValidationError("name", f"{name!r} is being registered concurrently; try again")


def resolve(session: Session, owner: str, ref: str) -> Definition:
    """The definition ``ref`` names for ``owner``: its own, else a published one. Raises
    :class:`ValidationError` (field ``workflow``) for a malformed or unknown reference."""
    found = REFERENCE.fullmatch(ref)
    if found is None:
        raise ValidationError("workflow", f"{ref[:220]!r} is not a name or name@version")
    name, version = found.group(1), found.group(2)
    for scope in (owner, SHARED):
        query = select(WorkflowDefinition).where(
            WorkflowDefinition.owner == scope, WorkflowDefinition.name == name
        )
        if version is not None:
            query = query.where(WorkflowDefinition.version == int(version))
        row = session.scalars(query.order_by(WorkflowDefinition.version.desc())).first()
        if row is not None:
            return _of(row)
    raise ValidationError(
        "workflow", f"no workflow {ref!r} is registered (orchestration workflows register FILE)"
    )


def listed(session: Session, owner: str, name: str | None = None) -> list[Definition]:
    """The owner's and the published definitions (of ``name``), by name, newest first."""
    query = select(WorkflowDefinition).where(
        or_(WorkflowDefinition.owner == owner, WorkflowDefinition.owner == SHARED)
    )
    if name is not None:
        query = query.where(WorkflowDefinition.name == name)
    rows = session.scalars(
        query.order_by(
            WorkflowDefinition.name,
            WorkflowDefinition.owner.desc(),
            WorkflowDefinition.version.desc(),
        )
    )
    return [_of(row) for row in rows]
