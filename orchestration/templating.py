"""Step task templates: ``{{ args.path }}`` and ``{{ steps.ID.output.path }}``, nothing else.

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

from orchestration.errors import ValidationError

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_SEGMENT = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
#: Deeper task values are refused: they are almost always a mistake or an attack.
MAX_DEPTH = 32


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
    raise ValidationError(
        field,
        f"placeholder {{{{ {expr} }}}} must start with 'args.' or 'steps.<id>.output'",
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
) -> None:
    """Check every placeholder at launch: syntax, known steps, and args paths when known."""
    for where, text in _strings(task, field):
        for expr in PLACEHOLDER.findall(text):
            parts = _path(expr, where)
            if parts[0] == "steps" and parts[1] not in earlier_steps:
                raise ValidationError(
                    where,
                    f"placeholder {{{{ {expr} }}}} names step {parts[1]!r}, which is not an "
                    "earlier step",
                )
            if parts[0] == "args" and args is not None:
                _lookup(args, parts[1:], expr, where)


def render(task: Any, context: Mapping[str, Any], field: str = "task") -> Any:
    """Fill the placeholders from ``context`` (``{"args": …, "steps": {id: {"output": …}}}``).

    Raises :class:`ValidationError` when a path is missing (an earlier step's output lacks it).
    """
    if isinstance(task, str):
        whole = PLACEHOLDER.fullmatch(task.strip())
        if whole:
            expr = whole.group(1)
            return _lookup(context, _path(expr, field), expr, field)

        def replace(match: re.Match[str]) -> str:
            expr = match.group(1)
            value = _lookup(context, _path(expr, field), expr, field)
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

        return PLACEHOLDER.sub(replace, task)
    if isinstance(task, Mapping):
        return {key: render(item, context, f"{field}.{key}") for key, item in task.items()}
    if isinstance(task, list):
        return [render(item, context, f"{field}[{i}]") for i, item in enumerate(task)]
    return task
