"""A wall-clock budget shared by the provider calls made inside it.

``cancel`` stops every live turn of a run before it returns, and must return within a stated
bound however many turns there are and however slowly their providers answer. It opens one
budget; each provider call made inside clamps its own bound to what is left of it, so the
calls together never outlast the budget.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("provider_call_deadline", default=None)


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Provider calls made inside this block end within ``seconds`` from now, together."""
    deadline = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def clamp(bound: float) -> float:
    """``bound`` (seconds), shortened to what is left of the enclosing budget, if any."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return bound
    return max(0.0, min(bound, deadline - time.monotonic()))
