"""The workflow's models: a workflow, its steps, and each step's kind (a provider turn, an
approval, or branches), with their canonical stored form.

Validation against the operator's settings (providers, sizes, bounds) is in
:mod:`orchestration.workflows.parsing`; these models check only what a workflow says of itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from orchestration.core.states import Join, RetryOn
from orchestration.workflows.schedules import ScheduleSpec

STEP_ID_PATTERN = r"^[A-Za-z0-9_-]{1,80}$"
#: A registered agent's name (``orchestration agents add``).
AGENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$"
#: Poll intervals of a step that sets none, lowered to ``ORCH_MAX_POLL_INTERVAL_LIMIT`` when
#: that is lower (see ``workflows``).
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_MAX_POLL_INTERVAL = 10.0


def _at_least(value: float, info: ValidationInfo, other: str) -> float:
    """A ceiling field may not be below the field it bounds (validated before it)."""
    if value < info.data.get(other, 0):
        raise ValueError(f"must be at least {other}")
    return value


class RetrySpec(BaseModel):
    """``retry:``: how many attempts a step gets, the wait before each new one, and what
    ends an attempt that may be retried. A cancel, a step timeout, a refused start and an
    over-limit value are never retried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Attempts in all, the first included.
    attempts: int = Field(ge=1)
    #: Seconds before the second attempt; doubled for each later one.
    backoff: float = Field(1.0, ge=0)
    #: The longest wait between two attempts.
    max_backoff: float = Field(60.0, ge=0)
    on: tuple[RetryOn, ...] = Field((RetryOn.FAILED,), min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 (PyYAML) reads a bare ``on:`` key as the boolean true, as GitHub Actions
        # users know; in a retry block it can only mean ``on``.
        if isinstance(data, Mapping) and True in data and "on" not in data:
            return {("on" if key is True else key): value for key, value in data.items()}
        return data

    @field_validator("max_backoff")
    @classmethod
    def _ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _at_least(value, info, "backoff")

    def delay(self, ended: int) -> float:
        """Seconds between the end of attempt ``ended`` and the start of the next one."""
        return float(min(self.max_backoff, self.backoff * 2 ** min(ended - 1, 30)))

    def retries(self, ended: int, reason: RetryOn) -> bool:
        """Whether attempt ``ended``, ended for ``reason``, is followed by another."""
        return reason in self.on and ended < self.attempts

    def rest(self, attempt: int, timeout: float, longest_reset: float) -> float:
        """The most seconds the attempts after ``attempt`` can add: each one's wait (a rate
        limit's reset is waited for up to ``longest_reset``) and its timeout."""
        total = 0.0
        for ended in range(attempt, self.attempts):
            wait = self.delay(ended)
            if RetryOn.RATE_LIMITED in self.on:
                wait = max(wait, longest_reset)
            total += wait + timeout
        return total


class OnExpiry(StrEnum):
    """What an approval that nobody decided in time comes to."""

    #: The run continues, as if approved.
    APPROVE = "approve"
    #: The run fails ``approval_rejected``, as if rejected.
    REJECT = "reject"
    #: The run fails ``approval_expired``.
    FAIL = "fail"


class ApprovalSpec(BaseModel):
    """``approval:``: a step that asks a person and parks until a decision or its expiry; no
    provider, no worker waiting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: What the person is asked (a string or JSON; templates as in ``task``).
    prompt: Any = ""
    #: Seconds the decision may take; at most ``ORCH_MAX_APPROVAL_EXPIRY``.
    expires_in: float = Field(gt=0)
    on_expiry: OnExpiry = OnExpiry.REJECT


#: The provider column of an approval step and of a branching step (they call no provider).
APPROVAL_PROVIDER = "approval"
BRANCHES_PROVIDER = "branches"
TURNLESS_PROVIDERS: frozenset[str] = frozenset({APPROVAL_PROVIDER, BRANCHES_PROVIDER})
_BRANCHING = ("for_each", "parallel")


def provider_column(step: Mapping[str, Any]) -> str:
    """What a stored step's row names as its provider."""
    if "provider" in step:
        return str(step["provider"])
    return BRANCHES_PROVIDER if any(key in step for key in _BRANCHING) else APPROVAL_PROVIDER


class ParallelSpec(BaseModel):
    """``parallel:``: fixed branches, each a full step with its own provider."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    join: Join = Join.ALL
    max_concurrency: int | None = Field(None, ge=1)
    steps: list[StepSpec] = Field(min_length=1)

    @field_validator("steps")
    @classmethod
    def _unique_ids(cls, steps: list[StepSpec]) -> list[StepSpec]:
        return _unique(steps, "parallel step")


def _unique(steps: list[StepSpec], what: str) -> list[StepSpec]:
    seen: set[str] = set()
    for step in steps:
        if step.id in seen:
            raise ValueError(f"{what} id {step.id!r} is used twice; ids must be unique")
        seen.add(step.id)
    return steps


class StepSpec(BaseModel):
    """One step as the user wrote it: a provider turn, an ``approval``, or branches
    (``for_each`` over a list, or ``parallel`` fixed steps) that each run as a branch run."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # pydantic matches with Rust's regex, where ``$`` is the end of the text (no newline).
    id: str = Field(pattern=STEP_ID_PATTERN)
    provider: str = Field(APPROVAL_PROVIDER, min_length=1, max_length=80)
    #: A registered agent, which supplies the provider, its URL and its secret; the stored
    #: step keeps both (``provider`` is then the agent's).
    agent: str | None = Field(None, pattern=AGENT_PATTERN)
    #: Fail the step (``agent_changed``) when its agent's version at the turn's start is not
    #: the one recorded at launch.
    pin: bool = False
    task: Any = ""
    options: dict[str, Any] = Field(default_factory=dict, alias="with")
    timeout: float = Field(1800.0, gt=0)
    poll_interval: float = Field(DEFAULT_POLL_INTERVAL, gt=0)
    max_poll_interval: float = Field(DEFAULT_MAX_POLL_INTERVAL, gt=0)
    retry: RetrySpec | None = None
    approval: ApprovalSpec | None = None
    #: A JSON list, or one placeholder that renders to one: a branch per item.
    for_each: Any = None
    #: The branch a ``for_each`` runs per item (``{{ item }}`` and ``{{ index }}`` in it).
    step: StepSpec | None = None
    max_concurrency: int | None = Field(None, ge=1)
    join: Join = Join.ALL
    parallel: ParallelSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _branch_id(cls, data: Any) -> Any:
        # A for_each's branch step is named by the step that runs it.
        inner = data.get("step") if isinstance(data, Mapping) else None
        if isinstance(inner, Mapping) and "id" not in inner and "id" in data:
            return {**data, "step": {"id": data["id"], **inner}}
        return data

    @field_validator("max_poll_interval")
    @classmethod
    def _intervals(cls, value: float, info: ValidationInfo) -> float:
        return _at_least(value, info, "poll_interval")

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        given = self.model_fields_set
        kinds = [
            name
            for name, present in (
                ("provider", "provider" in given and self.agent is None),
                ("agent", self.agent is not None),
                ("approval", self.approval is not None),
                ("for_each", self.for_each is not None),
                ("parallel", self.parallel is not None),
            )
            if present
        ]
        if not kinds:
            raise ValueError(
                "a step needs a provider, an agent, an approval, a for_each or a parallel"
            )
        if len(kinds) > 1:
            raise ValueError(
                "a step is one of provider, agent, approval, for_each or parallel; "
                f"this one has {' and '.join(kinds)}"
            )
        kind = kinds[0]
        turn = kind in ("provider", "agent")
        if not turn and self.pin:
            raise ValueError(f"a {kind} step has no pin (it calls no agent)")
        if not turn and {"task", "options"} & given:
            raise ValueError(f"a {kind} step has no task or with")
        if not turn and self.retry is not None:
            where = " (give the branch's step one)" if kind in _BRANCHING else ""
            raise ValueError(f"a {kind} step has no retry{where}")
        if (self.step is not None) != (kind == "for_each"):
            raise ValueError("a for_each step needs a step (the branch), and only it has one")
        if kind != "for_each" and {"max_concurrency", "join"} & given:
            raise ValueError(
                "max_concurrency and join belong to a for_each step (or under parallel)"
            )
        return self

    @property
    def branching(self) -> bool:
        """Whether this step runs branch runs instead of a turn of its own."""
        return self.for_each is not None or self.parallel is not None

    @property
    def branch_join(self) -> Join:
        return self.parallel.join if self.parallel is not None else self.join

    @property
    def branch_limit(self) -> int | None:
        """The step's own ``max_concurrency`` (``None``: as many as the setting allows)."""
        return self.parallel.max_concurrency if self.parallel is not None else self.max_concurrency


ParallelSpec.model_rebuild()


class WorkflowSpec(BaseModel):
    """A whole workflow."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    steps: list[StepSpec] = Field(min_length=1)
    #: What a launch's args must be: a JSON Schema subset
    #: (:mod:`orchestration.workflows.args_schema`).
    args_schema: dict[str, Any] | None = None
    #: When the beat launches it by itself (:mod:`orchestration.workflows.schedules`).
    schedule: ScheduleSpec | None = None

    @field_validator("steps")
    @classmethod
    def _unique_ids(cls, steps: list[StepSpec]) -> list[StepSpec]:
        return _unique(steps, "step")

    def as_dict(self) -> dict[str, Any]:
        """The canonical dict (what is stored on the run and fingerprinted); a step has only
        the keys of its kind, so a plain step's fingerprint is what it was before retries,
        approvals and branches existed."""
        data = self.model_dump(mode="json", by_alias=True)
        for optional in ("args_schema", "schedule"):
            if data.get(optional) is None:
                data.pop(optional, None)
        if self.schedule is not None:
            data["schedule"] = self.schedule.as_dict()
        for step in data["steps"]:
            _canonical(step)
        return data


def _canonical(step: dict[str, Any]) -> dict[str, Any]:
    for optional in (
        "retry",
        "approval",
        "for_each",
        "step",
        "parallel",
        "max_concurrency",
        "agent",
    ):
        if step.get(optional) is None:
            step.pop(optional, None)
    if not step.get("pin"):
        step.pop("pin", None)
    branching = any(key in step for key in _BRANCHING)
    if "for_each" not in step:  # a parallel step has its join under parallel
        step.pop("join", None)
    if "approval" in step or branching:  # it calls no provider: none of a turn's fields
        for field in ("provider", "task", "with"):
            step.pop(field, None)
    if branching:
        for field in ("timeout", "poll_interval", "max_poll_interval"):
            step.pop(field, None)
    if "step" in step:
        _canonical(step["step"])
    if "parallel" in step:
        if step["parallel"].get("max_concurrency") is None:
            step["parallel"].pop("max_concurrency", None)
        for branch in step["parallel"]["steps"]:
            _canonical(branch)
    return step


def canonical_step(step: StepSpec) -> dict[str, Any]:
    """One step as the canonical dict stores it (a branch run's only step)."""
    return _canonical(step.model_dump(mode="json", by_alias=True))
