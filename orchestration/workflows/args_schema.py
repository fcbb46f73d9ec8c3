"""A workflow's ``args_schema``: a JSON Schema subset checked at launch, before anything is
written, with an error naming the field (``args.topic``).

A subset on purpose: ``type``, ``properties``, ``required``, ``additionalProperties``
(boolean), ``items``, ``enum``, ``minimum``/``maximum``, ``minLength``/``maxLength``,
``minItems``/``maxItems``, plus ``title``, ``description`` and ``default`` (shown, not
checked). An unknown keyword is refused when the workflow is parsed, so a misspelt
``minLenght`` does not silently check nothing; no ``$ref``, no ``pattern`` (a tenant's regex
could take the launch hostage).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestration.core.errors import ValidationError

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "title",
    "description",
    "default",
}
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
#: Deeper schemas are refused: nesting past this is a mistake or an attack.
MAX_DEPTH = 16


def check_schema(schema: Any, field: str = "args_schema", depth: int = 0) -> None:
    """Refuse a schema outside the subset, naming where (``args_schema.properties.topic``)."""
    if depth > MAX_DEPTH:
        raise ValidationError(field, f"is nested deeper than {MAX_DEPTH} levels")
    if not isinstance(schema, Mapping):
        raise ValidationError(field, "must be an object (a JSON Schema)")
    unknown = sorted(set(schema) - _KEYWORDS)
    if unknown:
        raise ValidationError(
            field, f"unknown keyword {unknown[0]!r}; known: {', '.join(sorted(_KEYWORDS))}"
        )
    kinds = schema.get("type")
    for kind in [kinds] if isinstance(kinds, str) or kinds is None else kinds:
        if kind is not None and kind not in TYPES:
            raise ValidationError(f"{field}.type", f"{kind!r} is not one of {', '.join(TYPES)}")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ValidationError(f"{field}.properties", "must be an object of schemas")
    for name, sub in properties.items():
        check_schema(sub, f"{field}.properties.{name}", depth + 1)
    required = schema.get("required", [])
    if not (isinstance(required, list) and all(isinstance(name, str) for name in required)):
        raise ValidationError(f"{field}.required", "must be a list of property names")
    if "items" in schema:
        check_schema(schema["items"], f"{field}.items", depth + 1)
    if not isinstance(schema.get("additionalProperties", True), bool):
        raise ValidationError(f"{field}.additionalProperties", "must be true or false")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValidationError(f"{field}.enum", "must be a list of values")
    for bound in ("minimum", "maximum", *_COUNTS):
        value = schema.get(bound)
        if value is None:
            continue
        whole = bound in _COUNTS
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            raise ValidationError(f"{field}.{bound}", "must be a number")
        if whole and value < 0:
            raise ValidationError(f"{field}.{bound}", "must be at least 0")


def _is(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(
        value,
        {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}[kind],
    )


def check(schema: Mapping[str, Any], value: Any, field: str = "args") -> None:
    """Raise :class:`ValidationError` naming the first field of ``value`` that ``schema``
    refuses (a schema already passed :func:`check_schema`)."""
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(kind, value) for kind in allowed):
            raise ValidationError(field, f"must be {' or '.join(allowed)}, not {_name(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise ValidationError(field, f"must be one of {schema['enum']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ValidationError(field, f"must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ValidationError(field, f"must be at most {schema['maximum']}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValidationError(field, "must be a finite number")
    if isinstance(value, (str, list)):
        what = "characters" if isinstance(value, str) else "items"
        low, high = (
            ("minLength", "maxLength") if isinstance(value, str) else ("minItems", "maxItems")
        )
        if low in schema and len(value) < schema[low]:
            raise ValidationError(field, f"must have at least {schema[low]} {what}")
        if high in schema and len(value) > schema[high]:
            raise ValidationError(field, f"must have at most {schema[high]} {what}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            check(schema["items"], item, f"{field}[{index}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise ValidationError(f"{field}.{name}", "is required")
        for name, item in value.items():
            if name in properties:
                check(properties[name], item, f"{field}.{name}")
            elif schema.get("additionalProperties", True) is False:
                raise ValidationError(f"{field}.{name}", "is not a known argument")


def _name(value: Any) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is(kind, value):
            return kind
    return type(value).__name__
