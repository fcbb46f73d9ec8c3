"""Workflow definitions: parsing YAML/JSON files or dicts, validation, and canonical form.

A workflow is ``name`` and ``steps``; each step names a provider, a ``task`` (a string or any
JSON value, templated from ``args`` and earlier steps' outputs by :mod:`templating`), provider
options under ``with``, and its time bounds. Every error names the field, and nothing is
written for an invalid workflow.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from orchestration import providers, templating
from orchestration.errors import LimitExceeded, ValidationError
from orchestration.settings import Settings
from orchestration.states import RetryOn

STEP_ID_PATTERN = r"^[A-Za-z0-9_-]{1,80}$"
#: Poll intervals of a step that sets none, lowered to ``ORCH_MAX_POLL_INTERVAL_LIMIT`` when
#: that is lower (see :func:`_default_intervals`).
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


#: The provider column of an approval step (it calls no provider).
APPROVAL_PROVIDER = "approval"


class StepSpec(BaseModel):
    """One step as the user wrote it: a provider turn, or an ``approval``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # pydantic matches with Rust's regex, where ``$`` is the end of the text (no newline).
    id: str = Field(pattern=STEP_ID_PATTERN)
    provider: str = Field(APPROVAL_PROVIDER, min_length=1, max_length=80)
    task: Any = ""
    options: dict[str, Any] = Field(default_factory=dict, alias="with")
    timeout: float = Field(1800.0, gt=0)
    poll_interval: float = Field(DEFAULT_POLL_INTERVAL, gt=0)
    max_poll_interval: float = Field(DEFAULT_MAX_POLL_INTERVAL, gt=0)
    retry: RetrySpec | None = None
    approval: ApprovalSpec | None = None

    @field_validator("max_poll_interval")
    @classmethod
    def _intervals(cls, value: float, info: ValidationInfo) -> float:
        return _at_least(value, info, "poll_interval")

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        given = self.model_fields_set
        if self.approval is None and "provider" not in given:
            raise ValueError("a step needs a provider, or an approval")
        if self.approval is not None and ({"provider", "task", "options"} & given):
            raise ValueError("an approval step has no provider, task or with")
        if self.approval is not None and self.retry is not None:
            raise ValueError("an approval step has no retry")
        return self


class WorkflowSpec(BaseModel):
    """A whole workflow."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    steps: list[StepSpec] = Field(min_length=1)

    @field_validator("steps")
    @classmethod
    def _unique_ids(cls, steps: list[StepSpec]) -> list[StepSpec]:
        seen: set[str] = set()
        for step in steps:
            if step.id in seen:
                raise ValueError(f"step id {step.id!r} is used twice; step ids must be unique")
            seen.add(step.id)
        return steps

    def as_dict(self) -> dict[str, Any]:
        """The canonical dict (what is stored on the run and fingerprinted); a step without
        ``retry`` has no such key, so its fingerprint is what it was before retries existed."""
        data = self.model_dump(mode="json", by_alias=True)
        for step in data["steps"]:
            for optional in ("retry", "approval"):
                if step.get(optional) is None:
                    step.pop(optional, None)
            if "approval" in step:  # it calls no provider: it has none of a turn's fields
                for field in ("provider", "task", "with"):
                    step.pop(field, None)
        return data


def _field_of(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def parse(data: Any, settings: Settings, *, args: Mapping[str, Any] | None = None) -> WorkflowSpec:
    """Validate a workflow dict against the schema, the providers and the limits.

    ``args``, when given, are checked against the templates (an ``{{ args.x }}`` that the args
    lack is an error at launch, not at the step). Raises :class:`ValidationError` naming the
    field, or :class:`LimitExceeded`.
    """
    if not isinstance(data, Mapping):
        raise ValidationError("workflow", "must be a mapping with 'name' and 'steps'")
    steps = data.get("steps")
    if isinstance(steps, list) and len(steps) > settings.max_steps:
        raise LimitExceeded(
            "steps",
            f"{len(steps)} steps is over the limit of {settings.max_steps} (ORCH_MAX_STEPS)",
        )
    try:
        spec = WorkflowSpec.model_validate(data)
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        field = _field_of(tuple(first["loc"])) or "workflow"
        if first["type"] == "extra_forbidden":
            message = "is not a known field"
        raise ValidationError(field, message) from None
    spec = _default_intervals(spec, settings)
    earlier: list[str] = []
    for index, step in enumerate(spec.steps):
        where = f"steps[{index}]"
        if step.approval is not None:
            _check_approval(step.approval, where, settings, args, earlier)
            earlier.append(step.id)
            continue
        if step.provider not in providers.names():
            raise ValidationError(
                f"{where}.provider",
                f"unknown provider {step.provider!r}; known: {', '.join(providers.names())}",
            )
        try:
            providers.get_provider(step.provider, settings).validate(step.options)
        except ValidationError as exc:
            raise ValidationError(f"{where}.with.{exc.field}".rstrip("."), exc.problem) from None
        plain_json(step.options, f"{where}.with")
        size = plain_json(step.task, f"{where}.task")
        if size > settings.max_task_bytes:
            raise LimitExceeded(
                f"{where}.task",
                f"{size} bytes is over the limit of {settings.max_task_bytes} "
                "(ORCH_MAX_TASK_BYTES)",
            )
        templating.check(step.task, f"{where}.task", args=args, earlier_steps=earlier)
        _check_bounds(step, where, settings)
        earlier.append(step.id)
    return spec


def _default_intervals(spec: WorkflowSpec, settings: Settings) -> WorkflowSpec:
    """Give the intervals a step does not set values within ``ORCH_MAX_POLL_INTERVAL_LIMIT``.

    An operator who lowers the limit below the defaults must not get every workflow that
    relies on them refused: a default follows the limit, and only a value the workflow sets
    over it is an error (issue 10). The stored workflow holds the values used.
    """
    limit = settings.max_poll_interval_limit
    steps = []
    for step in spec.steps:
        given = step.model_fields_set
        poll = step.poll_interval if "poll_interval" in given else min(DEFAULT_POLL_INTERVAL, limit)
        ceiling = (
            step.max_poll_interval
            if "max_poll_interval" in given
            else max(poll, min(DEFAULT_MAX_POLL_INTERVAL, limit))
        )
        steps.append(step.model_copy(update={"poll_interval": poll, "max_poll_interval": ceiling}))
    return spec.model_copy(update={"steps": steps})


def _check_approval(
    approval: ApprovalSpec,
    where: str,
    settings: Settings,
    args: Mapping[str, Any] | None,
    earlier: list[str],
) -> None:
    plain_json(approval.prompt, f"{where}.approval.prompt")
    templating.check(approval.prompt, f"{where}.approval.prompt", args=args, earlier_steps=earlier)
    _seconds_within(
        f"{where}.approval.expires_in",
        approval.expires_in,
        settings.max_approval_expiry,
        "ORCH_MAX_APPROVAL_EXPIRY",
    )


def _seconds_within(field: str, value: float, limit: float, setting: str, why: str = "") -> None:
    """Refuse a duration over the operator's bound, naming the field and the setting."""
    if value > limit:
        raise LimitExceeded(field, f"{value}s is over the limit of {limit}s ({setting}){why}")


_HEARTBEATS = ", which keeps heartbeats within their timeout"


def _check_bounds(step: StepSpec, where: str, settings: Settings) -> None:
    limit = settings.max_poll_interval_limit
    for name in ("poll_interval", "max_poll_interval"):
        value = getattr(step, name)
        _seconds_within(
            f"{where}.{name}", value, limit, "ORCH_MAX_POLL_INTERVAL_LIMIT", _HEARTBEATS
        )
    _seconds_within(
        f"{where}.timeout", step.timeout, settings.max_step_timeout, "ORCH_MAX_STEP_TIMEOUT"
    )
    if step.retry is None:
        return
    if step.retry.attempts > settings.max_step_attempts:
        raise LimitExceeded(
            f"{where}.retry.attempts",
            f"{step.retry.attempts} attempts is over the limit of {settings.max_step_attempts} "
            "(ORCH_MAX_STEP_ATTEMPTS)",
        )
    _seconds_within(
        f"{where}.retry.max_backoff",
        step.retry.max_backoff,
        settings.max_retry_backoff,
        "ORCH_MAX_RETRY_BACKOFF",
    )


def load_file(path: str | Path) -> Any:
    """Read a workflow file (YAML or JSON) into plain data; errors name the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError("workflow", f"cannot read {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        # ValueError covers JSONDecodeError and Python's limit on huge integer literals.
        raise ValidationError("workflow", f"{path} is not valid YAML/JSON: {exc}") from None


def check_args(args: Any, settings: Settings) -> dict[str, Any]:
    """Args must be a JSON object within ``ORCH_MAX_ARGS_BYTES``."""
    if not isinstance(args, Mapping):
        raise ValidationError("args", "must be a JSON object")
    size = plain_json(args, "args")
    if size > settings.max_args_bytes:
        raise LimitExceeded(
            "args",
            f"{size} bytes is over the limit of {settings.max_args_bytes} (ORCH_MAX_ARGS_BYTES)",
        )
    return dict(args)


def plain_json(value: Any, field: str) -> int:
    """The UTF-8 size of ``value`` as strict JSON; a :class:`ValidationError` naming ``field``
    for anything else (NaN, a date, bytes, a lone surrogate, absurd nesting or integers)."""
    try:
        return len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        problem = "is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ValidationError(field, f"must be plain JSON: {problem}") from None


def fingerprint(
    workflow: Mapping[str, Any],
    args: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A stable hash of (workflow, args, launch options): what makes two launches "the same
    request"."""
    canonical = json.dumps(
        {"workflow": workflow, "args": args, **(extra or {})}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
