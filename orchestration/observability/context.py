"""The run, step, attempt and task the current code is working on, for logs and spans.

A contextvar, so that each thread or asyncio task of the API sees only its own call's run,
and a pool process only its current task's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from orchestration.observability import tracing

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_current: ContextVar[Mapping[str, Any]] = ContextVar("orchestration_context", default=_EMPTY)


def fields() -> Mapping[str, Any]:
    """What is known now (``{}`` outside any scope)."""
    return _current.get()


@contextmanager
def scope(**values: Any) -> Iterator[None]:
    """Carry ``values`` (``None`` ones are left out) until the block ends; a nested scope
    adds to its outer one, and what :func:`bind` adds inside ends with the block too."""
    token = _current.set(MappingProxyType({**_current.get(), **_known(values)}))
    try:
        yield
    finally:
        _current.reset(token)


def bind(**values: Any) -> None:
    """Add what became known inside a scope (a step's name and attempt, read from its row)
    to the rest of the scope, and to the current span's attributes. Outside any scope (a
    test driving the stepper) only the span gets them: nothing would end the binding."""
    known = _known(values)
    if _current.get() is not _EMPTY:
        _current.set(MappingProxyType({**_current.get(), **known}))
    tracing.annotate(known)


@contextmanager
def acting(run_id: str, name: str, **attributes: Any) -> Iterator[None]:
    """One action on a run from outside its tasks (a cancel, a sweeper rule): its log lines
    and its span (``name``) join the run's."""
    with (
        scope(run_id=run_id, owner=attributes.get("owner")),
        tracing.run_span(run_id, name, **attributes),
    ):
        yield


def _known(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}
