"""Item 5: ``bench.sweep_cost.measure``, with its statement count taken where it now lands.

``sweep_cost.measure`` listens on ``get_engine(url)``, but ``Settings`` now adds
``idle_in_transaction_session_timeout`` to a PostgreSQL URL, so the sweeper's statements go
through another engine and the count reads 0. This wrapper leaves the measurement as it is
and counts the statements of each ``Sweeper.sweep`` call on every engine instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from bench import sweep_cost
from orchestration.upkeep.sweeper import Sweeper


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Statements per ``Sweeper.sweep`` call, appended to the yielded list."""
    passes: list[int] = []
    state = {"inside": False, "count": 0}
    original = Sweeper.sweep

    def statement(*_: Any) -> None:
        if state["inside"]:
            state["count"] += 1

    def sweep(self: Sweeper, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state["inside"], state["count"] = True, 0
        try:
            return original(self, *args, **kwargs)
        finally:
            state["inside"] = False
            passes.append(int(state["count"]))

    event.listen(Engine, "before_cursor_execute", statement)
    Sweeper.sweep = sweep  # type: ignore[method-assign]
    try:
        yield passes
    finally:
        Sweeper.sweep = original  # type: ignore[method-assign]
        event.remove(Engine, "before_cursor_execute", statement)


def measure(admin_url: str, terminal: int, live: int, repeat: int) -> dict[str, Any]:
    """One row of the sweep table (see ``bench.sweep_cost.measure``)."""
    with _counting() as passes:
        row = sweep_cost.measure(admin_url, terminal, live, repeat)
    row["statements_per_pass"] = statistics.median(passes) if passes else row["statements_per_pass"]
    return row
