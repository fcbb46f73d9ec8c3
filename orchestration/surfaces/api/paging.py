"""Cursor pagination over ``Orchestrator.list``, which filters by status and health in SQL.

Pages hold summaries (:class:`~orchestration.reads.summaries.RunSummary`), never payloads. The
cursor is the last run returned; a client follows ``next_cursor`` until it is ``null``.

``Orchestrator.list`` pages with ``created_at < before``, which would skip runs sharing the
boundary's timestamp; so each page asks for ``before = created_at + 1µs`` and drops the runs
already read by comparing ``(created_at, id)``, the list's own order.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime, timedelta

from orchestration.core.errors import ValidationError
from orchestration.reads.summaries import RunSummary
from orchestration.service import MAX_PAGE, Orchestrator

#: Most runs one request reads: a page, plus the runs of a boundary microsecond skipped.
SCAN_LIMIT = 4 * MAX_PAGE
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, order=True)
class Key:
    """A position in the list's order: newest first, ties by id descending.

    An empty ``run_id`` means every run at ``created_at`` was read.
    """

    created_at: datetime
    run_id: str

    def encode(self) -> str:
        raw = f"{self.created_at.isoformat()}|{self.run_id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str) -> Key:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            stamp, run_id = raw.split("|", 1)
            created_at = datetime.fromisoformat(stamp)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ValidationError("cursor", "is not a cursor this API returned") from None
        if created_at.tzinfo is None:
            raise ValidationError("cursor", "is not a cursor this API returned")
        return cls(created_at, run_id)

    @classmethod
    def of(cls, record: RunSummary) -> Key:
        return cls(record.created_at, record.id)


def start_key(cursor: str | None, before: datetime | None) -> Key | None:
    """Where a page starts: after ``cursor``, or strictly before the ``before`` timestamp."""
    if cursor is not None and before is not None:
        raise ValidationError("cursor", "give either cursor or before, not both")
    if cursor is not None:
        return Key.decode(cursor)
    if before is not None:
        if before.tzinfo is None:
            raise ValidationError("before", "must include a timezone, e.g. 2026-01-01T00:00:00Z")
        return Key(before, "")
    return None


def page(
    orch: Orchestrator,
    *,
    owner: str | None,
    status: str | None,
    health: str | None,
    limit: int,
    after: Key | None,
    top_level: bool = False,
) -> tuple[list[RunSummary], Key | None]:
    """Up to ``limit`` of the owner's runs (every owner's for ``None``: the operator's)
    after ``after``; and the key to continue from. ``top_level``: without branch runs, each
    run with its branch count (the dashboard's list).

    Raises :class:`ValidationError` for a bad filter or ``limit``.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValidationError("limit", f"must be between 1 and {MAX_PAGE}")
    found: list[RunSummary] = []
    seen = after
    scanned = 0
    while True:
        before = None
        if seen is not None:
            before = seen.created_at + _TICK if seen.run_id else seen.created_at
        batch = orch.list_all(
            owner=owner,
            status=status,
            health=health,
            limit=limit,
            before=before,
            top_level=top_level,
        )
        scanned += len(batch)
        fresh = [record for record in batch if seen is None or Key.of(record) < seen]
        if not fresh and len(batch) == limit and seen is not None:
            # More than a page of runs share one microsecond: step past all of them.
            seen = Key(seen.created_at, "")
            continue
        for record in fresh:
            seen = Key.of(record)
            found.append(record)
            if len(found) == limit:
                return found, seen
        if len(batch) < limit:
            return found, None
        if scanned >= SCAN_LIMIT:
            return found, seen
