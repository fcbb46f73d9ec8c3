"""Each owner's share of a shared loop's pass (issue 30): round robin, bounded per owner.

The sweeper's pass and the schedules' pass serve every owner from one process. Taken in the
order the database returns them, one owner's backlog (10,000 dead-heartbeat runs, a storm of
schedules) would fill a pass, and a pass killed by its time limit would leave the owners
that come after it out every time. :func:`round_robin` orders a pass's work as every owner's
first item, then every owner's second, and so on, up to ``share`` an owner; the rest waits
for the next pass, where it comes first within its owner again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def round_robin(items: Iterable[T], owner: Callable[[T], str], share: int) -> tuple[list[T], int]:
    """``items`` (each owner's in the order given) in rounds across owners, at most ``share``
    an owner; and how many were left out."""
    queues: dict[str, list[T]] = {}
    for item in items:
        queues.setdefault(owner(item), []).append(item)
    taken = [queue[turn] for turn in range(share) for queue in queues.values() if turn < len(queue)]
    left = sum(max(0, len(queue) - share) for queue in queues.values())
    return taken, left
