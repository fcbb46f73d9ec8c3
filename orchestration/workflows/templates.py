"""Step task templates: ``{{ args.path }}`` and ``{{ steps.ID.output.path }}`` (and, in a
``for_each`` branch, ``{{ item.path }}`` and ``{{ index }}``), nothing else.

Deliberately not a template engine: a placeholder is a dotted path into plain data, so a
hostile ``task`` can name data but never run code. A string that is exactly one placeholder
becomes the value itself (a dict stays a dict); placeholders inside longer strings are
replaced by the value's text (JSON for non-strings).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from orchestration.core.errors import LimitExceeded, ValidationError
from orchestration.limits.bounds import MAX_DEPTH

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_SEGMENT = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def _strings(value: Any, field: str, depth: int = 0) -> list[tuple[str, str]]:
    if depth > MAX_DEPTH:
        raise ValidationError(field, f"is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        return [(field, value)]
    if isinstance(value, Mapping):
        found: list[tuple[str, str]] = []
        for key, item in value.items():
            found += _strings(item, f"{field}.{key}", depth + 1)
        return found
    if isinstance(value, list):
        found = []
        for index, item in enumerate(value):
            found += _strings(item, f"{field}[{index}]", depth + 1)
        return found
    return []


def _path(expr: str, field: str) -> list[str]:
    parts = expr.split(".")
    if not all(_SEGMENT.match(part) for part in parts):
        raise ValidationError(field, f"placeholder {{{{ {expr} }}}} is not a dotted path of names")
    if parts[0] == "args" and len(parts) >= 2:
        return parts
    if parts[0] == "steps" and len(parts) >= 3 and parts[2] == "output":
        return parts
    if parts[0] == "item" or parts == ["index"]:
        return parts
    raise ValidationError(
        field,
        f"placeholder {{{{ {expr} }}}} must start with 'args.' or 'steps.<id>.output'"
        " (or, in a for_each branch, be 'item' or 'index')",
    )


def _lookup(data: Any, parts: list[str], expr: str, field: str) -> Any:
    for part in parts:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            raise ValidationError(field, f"placeholder {{{{ {expr} }}}}: {part!r} is not there")
    return data


def check(
    task: Any,
    field: str,
    *,
    args: Mapping[str, Any] | None,
    earlier_steps: Collection[str],
    item: bool = False,
) -> None:
    """Check every placeholder at launch: syntax, known steps, and args paths when known;
    ``item`` and ``index`` only where ``item`` says the step is a for_each branch."""
    for where, text in _strings(task, field):
        for expr in PLACEHOLDER.findall(text):
            parts = _path(expr, where)
            if parts[0] in ("item", "index") and not item:
                raise ValidationError(
                    where, f"placeholder {{{{ {expr} }}}} is only known in a for_each branch"
                )
            if parts[0] == "steps" and parts[1] not in earlier_steps:
                raise ValidationError(
                    where,
                    f"placeholder {{{{ {expr} }}}} names step {parts[1]!r}, which is not an "
                    "earlier step",
                )
            if parts[0] == "args" and args is not None:
                _lookup(args, parts[1:], expr, where)


class _Budget:
    """Bytes a rendering may still produce; charged as it goes, so a template that would
    expand to gigabytes stops at the limit instead of building them."""

    def __init__(self, limit: int | None, field: str) -> None:
        self.left = limit
        self.limit = limit
        self.field = field

    def charge(self, size: int) -> None:
        if self.left is None:
            return
        self.left -= size
        if self.left < 0:
            raise LimitExceeded(
                self.field,
                f"renders to over {self.limit} bytes (ORCH_MAX_RENDERED_TASK_BYTES); "
                "refer to less, or to smaller values",
            )


def has_placeholders(task: Any) -> bool:
    """Whether ``task`` names any data (a task without placeholders renders as itself)."""
    return any(PLACEHOLDER.search(text) for _, text in _strings(task, "task"))


def named_steps(task: Any) -> set[str]:
    """The step ids whose outputs ``task``'s placeholders name (their artifacts are loaded
    to render it; the others' are not)."""
    return {
        parts[1]
        for _, text in _strings(task, "task")
        for parts in (expr.split(".") for expr in PLACEHOLDER.findall(text))
        if len(parts) >= 2 and parts[0] == "steps"
    }


def render(
    task: Any, context: Mapping[str, Any], field: str = "task", *, limit: int | None = None
) -> Any:
    """Fill the placeholders from ``context`` (``{"args": …, "steps": {id: {"output": …}}}``).

    Raises :class:`ValidationError` when a path is missing (an earlier step's output lacks it)
    and :class:`LimitExceeded` when the result would be over ``limit`` bytes of JSON.
    """
    budget = _Budget(limit, field)
    rendered = _render(task, context, field, budget)
    if limit is not None:
        # The charges count raw text; JSON escaping can add to it, so the bound is checked on
        # what will be stored (cheap now: the charges kept it near the limit).
        budget.left = limit
        budget.charge(_size(rendered))
    return rendered


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _render(task: Any, context: Mapping[str, Any], field: str, budget: _Budget) -> Any:
    if isinstance(task, str):
        whole = PLACEHOLDER.fullmatch(task.strip())
        if whole:
            expr = whole.group(1)
            value = _lookup(context, _path(expr, field), expr, field)
            budget.charge(_size(value))
            return value
        budget.charge(len(task.encode()))

        def replace(match: re.Match[str]) -> str:
            expr = match.group(1)
            value = _lookup(context, _path(expr, field), expr, field)
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            budget.charge(len(text.encode()))
            return text

        return PLACEHOLDER.sub(replace, task)
    if isinstance(task, Mapping):
        budget.charge(sum(len(str(key).encode()) + 4 for key in task))
        return {key: _render(item, context, f"{field}.{key}", budget) for key, item in task.items()}
    if isinstance(task, list):
        return [_render(item, context, f"{field}[{i}]", budget) for i, item in enumerate(task)]
    budget.charge(_size(task))
    return task
