"""Step specs decoded once per process, by run.

A run's workflow never changes once launched, so its parsed steps are cached by run id: an
execution reads the ``workflow`` JSON (the largest column of the run) only the first time this
process sees the run.
"""

from __future__ import annotations

from collections import OrderedDict
from threading import Lock

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core.models import Run
from orchestration.workflows import agents
from orchestration.workflows.steps import StepSpec

#: Runs whose specs one process keeps.
CACHED_RUNS = 2048

_CACHE: OrderedDict[str, tuple[StepSpec, ...]] = OrderedDict()
_LOCK = Lock()


def of_run(session: Session, run_id: str) -> tuple[StepSpec, ...]:
    """The run's steps as parsed specs, an ``agent:`` step's options those of the entry its
    launch kept."""
    with _LOCK:
        cached = _CACHE.get(run_id)
        if cached is not None:
            _CACHE.move_to_end(run_id)
            return cached
    found = session.execute(select(Run.workflow, Run.agents).where(Run.id == run_id)).first()
    workflow, kept = (found.workflow, found.agents) if found is not None else (None, None)
    written = (StepSpec.model_validate(step) for step in (workflow or {}).get("steps", []))
    specs = agents.applied(written, kept)
    remember(run_id, specs)
    return specs


def remember(run_id: str, steps: tuple[StepSpec, ...]) -> None:
    """Seed the cache with a run's specs as its launch parsed them."""
    with _LOCK:
        _CACHE[run_id] = steps
        while len(_CACHE) > CACHED_RUNS:
            _CACHE.popitem(last=False)
