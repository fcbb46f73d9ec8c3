"""Which run a call may name: an id that can be one, of a run that is the caller's.

Another owner's run is :class:`RunNotFound`, exactly like a missing one (invariant 7); every
read or write that names a run for its owner decides it here.
"""

from __future__ import annotations

from typing import Any

from orchestration.core.errors import RunNotFound
from orchestration.core.models import Run


def checked(run_id: Any) -> str:
    """``run_id`` if it can name a run (text, at most 64 characters); else :class:`RunNotFound`."""
    if not isinstance(run_id, str) or len(run_id) > 64:
        raise RunNotFound(str(run_id)[:64])
    return run_id


def mine(run: Run | None, run_id: str, owner: str) -> Run:
    """``run`` if it exists and is ``owner``'s; else :class:`RunNotFound`."""
    if run is None or run.owner != owner:
        raise RunNotFound(run_id)
    return run
