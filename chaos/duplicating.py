"""A task queue that sends every chain twice: a duplicate delivery on purpose, over the real
broker.

For rehearsals and conformance runs (the chaos suite, the integration tests): a deployment must
start one provider turn per (run, step, attempt) however often Celery delivers a step task.
Kept out of the shipped package: nothing in production sends twice.
"""

from __future__ import annotations

from orchestration.core.followups import ChainPlan
from orchestration.runtime.executor import TaskQueue


class DuplicatingQueue:
    """Wraps a :class:`~orchestration.runtime.executor.TaskQueue`; chains go out twice."""

    def __init__(self, inner: TaskQueue) -> None:
        self.inner = inner

    def send_chain(self, plan: ChainPlan) -> None:
        self.inner.send_chain(plan)
        self.inner.send_chain(plan)

    def revoke(self, task_ids: list[str], *, terminate: bool) -> None:
        self.inner.revoke(task_ids, terminate=terminate)

    def stop_turns(self, turns: list[tuple[str, int]]) -> None:
        self.inner.stop_turns(turns)
