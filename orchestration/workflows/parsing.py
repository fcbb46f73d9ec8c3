"""Workflow definitions: parsing YAML/JSON files or dicts, and validation against the
operator's settings (the models are in :mod:`orchestration.workflows.steps`).

A workflow is ``name`` and ``steps``; each step names a provider, a ``task`` (a string or any
JSON value, templated from ``args`` and earlier steps' outputs by :mod:`templating`), provider
options under ``with``, and its time bounds; or it is an approval, or branches. Every error
names the field, and nothing is written for an invalid workflow.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError as PydanticValidationError

from orchestration import providers
from orchestration.core.errors import LimitExceeded, ValidationError
from orchestration.core.settings import Settings
from orchestration.limits.host_lookups import fields_under
from orchestration.providers.exchange import launch_checks
from orchestration.workflows import agents as registered_agents
from orchestration.workflows import args_schema
from orchestration.workflows import templates as templating
from orchestration.workflows.steps import (
    DEFAULT_MAX_POLL_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    ApprovalSpec,
    StepSpec,
    WorkflowSpec,
)


def _field_of(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def parse(
    data: Any,
    settings: Settings,
    *,
    args: Mapping[str, Any] | None = None,
    agents: Mapping[str, registered_agents.Entry] | None = None,
) -> WorkflowSpec:
    """Validate a workflow dict against the schema, the providers and the limits.

    ``args``, when given, are checked against the templates (an ``{{ args.x }}`` that the args
    lack is an error at launch, not at the step). ``agents`` are the registered agents the
    steps may name (:func:`orchestration.workflows.agents.load`); an ``agent:`` step's
    ``provider`` becomes its agent's. Raises :class:`ValidationError` naming the field, or
    :class:`LimitExceeded`.
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
    if "\x00" in spec.name:
        raise ValidationError("name", _NUL_PROBLEM)
    spec = spec.model_copy(
        update={
            "steps": [
                registered_agents.resolved(step, f"steps[{index}]", agents or {})
                for index, step in enumerate(spec.steps)
            ]
        }
    )
    if spec.args_schema is not None:
        plain_json(spec.args_schema, "args_schema")
        args_schema.check_schema(spec.args_schema)
        if args is not None:
            args_schema.check(spec.args_schema, dict(args))
        if spec.schedule is not None:
            args_schema.check(spec.args_schema, spec.schedule.args, "schedule.args")
    if spec.schedule is not None:
        check_args(spec.schedule.args, settings, "schedule.args")
    # A registered schedule's args are what its launches will have: check the templates now.
    if args is None and spec.schedule is not None:
        args = spec.schedule.args
    earlier: list[str] = []
    # The provider URLs' lookups run concurrently and share one deadline.
    with launch_checks(settings):
        for index, step in enumerate(spec.steps):
            _check_step(step, f"steps[{index}]", settings, args, earlier, agents=agents or {})
            earlier.append(step.id)
    return spec


def _check_step(
    step: StepSpec,
    where: str,
    settings: Settings,
    args: Mapping[str, Any] | None,
    earlier: list[str],
    *,
    item: bool = False,
    agents: Mapping[str, registered_agents.Entry],
) -> None:
    """Check one step (or branch, where ``item`` says whether ``{{ item }}`` is there)."""
    if step.approval is not None:
        _check_approval(step.approval, where, settings, args, earlier, item=item)
        return
    if step.branching:
        _check_branching(step, where, settings, args, earlier, agents)
        return
    if step.provider not in providers.names():
        raise ValidationError(
            f"{where}.provider",
            f"unknown provider {step.provider!r}; known: {', '.join(providers.names())}",
        )
    options = step.options
    if step.agent is not None:
        entry = agents[step.agent]
        registered_agents.check_step_options(entry, step.options, f"{where}.with")
        options = registered_agents.options(entry, step.options)
    elif step.provider not in _CALLS_NOTHING and not settings.allow_raw_urls:
        raise ValidationError(
            f"{where}.provider",
            f"step {step.id!r} names provider {step.provider!r} with URLs of its own; name a "
            "registered agent instead (agent: NAME), or the operator allows raw URLs with "
            "ORCH_ALLOW_RAW_URLS=true",
        )
    size = plain_json(step.options, f"{where}.with")
    if size > settings.max_options_bytes:
        raise LimitExceeded(
            f"{where}.with",
            f"{size} bytes is over the limit of {settings.max_options_bytes} "
            "(ORCH_MAX_OPTIONS_BYTES)",
        )
    try:
        with fields_under(f"{where}.with."):
            providers.get_provider(step.provider, settings).validate(options)
    except ValidationError as exc:
        raise type(exc)(f"{where}.with.{exc.field}".rstrip("."), exc.problem) from None
    size = plain_json(step.task, f"{where}.task")
    if size > settings.max_task_bytes:
        raise LimitExceeded(
            f"{where}.task",
            f"{size} bytes is over the limit of {settings.max_task_bytes} (ORCH_MAX_TASK_BYTES)",
        )
    templating.check(step.task, f"{where}.task", args=args, earlier_steps=earlier, item=item)
    _check_bounds(step, where, settings)


def _check_branching(
    step: StepSpec,
    where: str,
    settings: Settings,
    args: Mapping[str, Any] | None,
    earlier: list[str],
    agents: Mapping[str, registered_agents.Entry],
) -> None:
    limit = step.branch_limit
    if limit is not None and limit > settings.max_branch_concurrency:
        field = "parallel.max_concurrency" if step.parallel is not None else "max_concurrency"
        raise LimitExceeded(
            f"{where}.{field}",
            f"{limit} is over the limit of {settings.max_branch_concurrency} "
            "(ORCH_MAX_BRANCH_CONCURRENCY)",
        )
    if step.parallel is not None:
        count_branches(len(step.parallel.steps), f"{where}.parallel.steps", settings)
        for index, branch in enumerate(step.parallel.steps):
            inner = f"{where}.parallel.steps[{index}]"
            if branch.branching:
                raise ValidationError(inner, "a branch cannot itself branch (for_each or parallel)")
            _check_step(branch, inner, settings, args, earlier, agents=agents)
        return
    assert step.step is not None
    if step.step.branching:
        raise ValidationError(
            f"{where}.step", "a branch cannot itself branch (for_each or parallel)"
        )
    field = f"{where}.for_each"
    plain_json(step.for_each, field)
    if isinstance(step.for_each, str):
        whole = templating.PLACEHOLDER.fullmatch(step.for_each.strip())
        if whole is None:
            raise ValidationError(
                field, "must be a JSON list, or one placeholder such as {{ args.topics }}"
            )
        templating.check(step.for_each, field, args=args, earlier_steps=earlier)
        if args is not None and whole.group(1).split(".")[0] == "args":
            items_of(
                templating.render(step.for_each, {"args": args, "steps": {}}, field),
                field,
                settings,
            )
    else:
        items_of(step.for_each, field, settings)
    _check_step(step.step, f"{where}.step", settings, args, earlier, item=True, agents=agents)


#: Providers that call no URL a workflow names: allowed whatever ``ORCH_ALLOW_RAW_URLS`` says.
_CALLS_NOTHING = frozenset({"scripted"})


def items_of(value: Any, field: str, settings: Settings) -> list[Any]:
    """A for_each's items: a JSON list within ``ORCH_MAX_BRANCHES``."""
    if not isinstance(value, list):
        raise ValidationError(field, f"must be a JSON list, not {type(value).__name__}")
    count_branches(len(value), field, settings)
    return value


def count_branches(count: int, field: str, settings: Settings) -> None:
    """Refuse a step with more branches than ``ORCH_MAX_BRANCHES``, or none."""
    if count > settings.max_branches:
        raise LimitExceeded(
            field,
            f"{count} branches is over the limit of {settings.max_branches} (ORCH_MAX_BRANCHES)",
        )


def _default_intervals(spec: WorkflowSpec, settings: Settings) -> WorkflowSpec:
    """Give the intervals a step does not set values within ``ORCH_MAX_POLL_INTERVAL_LIMIT``.

    An operator who lowers the limit below the defaults must not get every workflow that
    relies on them refused: a default follows the limit, and only a value the workflow sets
    over it is an error (issue 10). The stored workflow holds the values used.
    """
    limit = settings.max_poll_interval_limit
    steps = [_intervals_within(step, limit) for step in spec.steps]
    return spec.model_copy(update={"steps": steps})


def _intervals_within(step: StepSpec, limit: float) -> StepSpec:
    given = step.model_fields_set
    poll = step.poll_interval if "poll_interval" in given else min(DEFAULT_POLL_INTERVAL, limit)
    ceiling = (
        step.max_poll_interval
        if "max_poll_interval" in given
        else max(poll, min(DEFAULT_MAX_POLL_INTERVAL, limit))
    )
    update: dict[str, Any] = {"poll_interval": poll, "max_poll_interval": ceiling}
    if step.step is not None:
        update["step"] = _intervals_within(step.step, limit)
    if step.parallel is not None:
        inner = [_intervals_within(branch, limit) for branch in step.parallel.steps]
        update["parallel"] = step.parallel.model_copy(update={"steps": inner})
    return step.model_copy(update=update)


def _check_approval(
    approval: ApprovalSpec,
    where: str,
    settings: Settings,
    args: Mapping[str, Any] | None,
    earlier: list[str],
    *,
    item: bool = False,
) -> None:
    plain_json(approval.prompt, f"{where}.approval.prompt")
    templating.check(
        approval.prompt, f"{where}.approval.prompt", args=args, earlier_steps=earlier, item=item
    )
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


class _JsonLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans (``true``/``false`` only): YAML 1.1 also
    reads ``on``, ``off``, ``yes`` and ``no`` as booleans, so ``retry: {on: [failed]}`` would
    load with a key ``True`` that no JSON can carry (``json.dumps`` writes it ``"true"``)."""


_JsonLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JsonLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a workflow file (YAML or JSON) into plain JSON data: ``json.dumps`` of it is the
    workflow, ``on:`` stays ``"on"`` (YAML 1.2's booleans, :class:`_JsonLoader`). Errors
    name the file; a file that holds no mapping (a bare string, a list) is refused here."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError("workflow", f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.load(text, _JsonLoader)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        # ValueError covers JSONDecodeError and Python's limit on huge integer literals.
        raise ValidationError("workflow", f"{path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, Mapping):
        found = "nothing" if data is None else f"a {_KINDS.get(type(data), type(data).__name__)}"
        raise ValidationError(
            "workflow",
            f"{path} holds {found}, not a workflow: a mapping with 'name' and 'steps'",
        )
    return dict(data)


#: How a file's top-level value is named when it is not a workflow.
_KINDS = {str: "string", list: "list", int: "number", float: "number", bool: "boolean"}


def check_args(args: Any, settings: Settings, field: str = "args") -> dict[str, Any]:
    """Args must be a JSON object within ``ORCH_MAX_ARGS_BYTES``."""
    if not isinstance(args, Mapping):
        raise ValidationError(field, "must be a JSON object")
    size = plain_json(args, field)
    if size > settings.max_args_bytes:
        raise LimitExceeded(
            field,
            f"{size} bytes is over the limit of {settings.max_args_bytes} (ORCH_MAX_ARGS_BYTES)",
        )
    return dict(args)


#: A NUL character in JSON text: ``\u0000`` after an even number of backslashes (an odd
#: number makes it the text ``\u0000``).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_NUL_PROBLEM = "must not hold a NUL character (\\u0000): PostgreSQL cannot store one"


def plain_json(value: Any, field: str) -> int:
    """The UTF-8 size of ``value`` as strict JSON; a :class:`ValidationError` naming ``field``
    for anything else (NaN, a date, bytes, a lone surrogate, absurd nesting or integers), and
    for a NUL character, which SQLite keeps but PostgreSQL refuses with a raw error."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        size = len(text.encode())
    except (TypeError, ValueError, RecursionError) as exc:
        problem = "is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ValidationError(field, f"must be plain JSON: {problem}") from None
    if "\\u0000" in text and _NUL.search(text):
        raise ValidationError(field, _NUL_PROBLEM)
    return size


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
