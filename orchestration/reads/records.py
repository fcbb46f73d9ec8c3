"""The run record as callers see it (CLI ``--json``, the Python API, the HTTP API)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestration.core.models import Run, Step
from orchestration.core.settings import Settings
from orchestration.core.states import Health


class StepRecord(BaseModel):
    """One step with everything an operator needs."""

    model_config = ConfigDict(from_attributes=True)

    step_id: str
    index: int
    provider: str
    status: str
    attempt: int
    idempotency_key: str | None
    provider_run_id: str | None
    input: Any
    output: Any
    #: Set (and ``output`` null) when the output was over ``ORCH_INLINE_OUTPUT_BYTES``:
    #: ``{sha256, size, media_type}``; ``GET /runs/{id}/steps/{step}/output`` serves it.
    output_artifact: dict[str, Any] | None = None
    error: str | None
    polls: int
    last_provider_status: str | None
    prompt: Any
    celery_task_id: str | None
    worker: str | None
    worker_pid: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    next_poll_at: datetime | None
    #: The provider cancel of the turn once the run ended it, or of the previous attempt's
    #: turn that a retry ended: ``{status, attempts, error, at, key, provider_run_id}``.
    turn_stop: Any = None
    #: A ``retrying`` step's next attempt starts no earlier than this.
    retry_at: datetime | None = None
    #: The attempts this step ended and retried, oldest first: ``{attempt, reason, error,
    #: provider_run_id, started_at, ended_at}``.
    past_attempts: list[dict[str, Any]] = Field(default_factory=list)
    #: A ``for_each`` or ``parallel`` step's branch runs, in branch order: ``{id, index,
    #: run_id, status, attempt, output, output_artifact, error, provider_run_id, started_at,
    #: finished_at}`` each (``None`` otherwise).
    branches: list[dict[str, Any]] | None = None
    #: What the step's agent said of itself: ``{launch, start}``, each ``{name, version,
    #: detail, at}`` or ``{error, at}`` (``None``: its provider does not describe itself).
    evidence: dict[str, Any] | None = None

    @field_validator("past_attempts", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


class RunRecord(BaseModel):
    """A run with all its fields, its derived health and its steps."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    owner: str
    request_id: str
    fingerprint: str
    workflow_name: str
    #: The registered definition's version (``workflow_name@workflow_version``) it runs;
    #: ``None`` when launched from a file.
    workflow_version: int | None = None
    workflow: dict[str, Any]
    args: dict[str, Any]
    status: str
    health: str
    stop_reason: str | None
    error: str | None
    result: Any
    #: Set (and ``result`` null) when the last step's output is an artifact.
    result_artifact: dict[str, Any] | None = None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    cancel_requested_at: datetime | None
    deadline_at: datetime | None
    task_ids: list[str]
    current_step: int
    rearms: int
    park_reason: str | None
    parked_since: datetime | None
    waiting_until: datetime | None
    concurrency_key: str | None
    on_conflict: str | None
    concurrency: str | None
    needs_review: bool
    #: A branch run: the run and step that made it, and its position and key there.
    parent_run_id: str | None = None
    parent_step: int | None = None
    branch: int | None = None
    branch_key: str | None = None
    #: A rerun: the run it reran; and the reruns made of this run, oldest first.
    rerun_of: str | None = None
    reruns: list[str] = Field(default_factory=list)
    steps: list[StepRecord]


def to_record(
    settings: Settings,
    run: Run,
    steps: list[Step],
    now: datetime,
    branches: Mapping[int, list[dict[str, Any]]] | None = None,
    reruns: list[str] | None = None,
    *,
    health: Health,
) -> RunRecord:
    """Build the record of ``run`` with its ``health`` (judged at the read, never stored) and
    the branch runs of its branching steps by step index."""
    data = {column.key: getattr(run, column.key) for column in Run.__table__.columns}
    data["health"] = health.value
    data["reruns"] = reruns or []
    if run.result_sha256 is not None:
        data.update(result=None, result_artifact=run.result)
    data["steps"] = [
        StepRecord.model_validate(step).model_copy(
            update={
                "branches": (branches or {}).get(step.index),
                **({"output": None, "output_artifact": step.output} if step.output_sha256 else {}),
            }
        )
        for step in steps
    ]
    return RunRecord.model_validate(data)
