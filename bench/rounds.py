"""The order of item 1's rounds: one chain of each contestant per round, each round starting
with a different one, so drift on the shared machine hits every contestant alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def order(index: int, contestants: Sequence[T]) -> list[T]:
    """Round ``index``'s contestants, rotated ``index`` places."""
    if not contestants:
        return []
    shift = index % len(contestants)
    return [*contestants[shift:], *contestants[:shift]]


def schedule(repeats: int, bare_repeats: int, bare: T, timed: Sequence[T]) -> list[list[T]]:
    """Every round in order: ``bare`` in the first ``bare_repeats`` rounds, the ``timed``
    contestants (the engine's chain, then the peers') in the first ``repeats``."""
    return [
        order(
            index,
            ([bare] if index < bare_repeats else []) + (list(timed) if index < repeats else []),
        )
        for index in range(max(repeats, bare_repeats))
    ]
