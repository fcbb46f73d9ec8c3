"""The launch form's fields, built from a workflow's ``args_schema`` (issue 33).

One field per top-level property: a text or number input for a scalar, a select for an
``enum`` or a boolean, a JSON textarea for objects, arrays and anything else. Each carries
the HTML attributes its schema implies (``required``, ``min``/``max``, ``minlength``/
``maxlength``), so a browser checks them before sending; the server checks them again and
is the guarantee: :func:`read` parses every field and checks it against its own property,
so each field's error is shown next to it, all at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestration.core.errors import ValidationError
from orchestration.workflows import args_schema

#: ``args_schema`` types a form field holds as text; the others are JSON.
SCALARS = ("string", "integer", "number", "boolean")


def as_text(value: Any) -> str:
    """How a value is written in a field: a string as itself, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class FormField:
    """One property of the schema as a form field."""

    name: str
    #: ``string``, ``integer``, ``number``, ``boolean``, or ``json``.
    kind: str
    required: bool
    #: The property's own schema, which :func:`read` checks the field's value against.
    schema: Mapping[str, Any]

    @property
    def enum(self) -> list[Any] | None:
        found = self.schema.get("enum")
        return found if isinstance(found, list) else None

    @property
    def description(self) -> str:
        return str(self.schema.get("description") or self.schema.get("title") or "")

    @property
    def options(self) -> list[str] | None:
        """The choices of a select (an enum's values, or ``true``/``false``), as text."""
        if self.enum is not None:
            return [as_text(option) for option in self.enum]
        return ["true", "false"] if self.kind == "boolean" else None

    def shown(self, given: Mapping[str, str]) -> str:
        """The field's text: what was submitted, else the schema's default."""
        key = f"arg.{self.name}"
        if key in given:
            return given[key]
        default = self.schema.get("default")
        return "" if default is None else as_text(default)

    def attributes(self) -> dict[str, str]:
        """The HTML attributes the schema implies (a browser's own check, before sending)."""
        found: dict[str, str] = {}
        if self.required:
            found["required"] = ""
        if self.options is None and self.kind in ("integer", "number"):
            found["step"] = "1" if self.kind == "integer" else "any"
            for bound, attribute in (("minimum", "min"), ("maximum", "max")):
                if bound in self.schema:
                    found[attribute] = str(self.schema[bound])
        if self.options is None and self.kind == "string":
            for bound, attribute in (("minLength", "minlength"), ("maxLength", "maxlength")):
                if bound in self.schema:
                    found[attribute] = str(self.schema[bound])
        return found

    @property
    def hint(self) -> str:
        """What the schema asks of the value, in words (``2 to 200 characters``)."""
        if self.options is not None:
            return ""
        if self.kind in ("integer", "number"):
            what = "a whole number" if self.kind == "integer" else "a number"
            return _range(what, self.schema.get("minimum"), self.schema.get("maximum"), "")
        if self.kind == "string":
            return _range(
                "", self.schema.get("minLength"), self.schema.get("maxLength"), " characters"
            )
        shape = self.schema.get("type")
        what = f"JSON ({shape})" if isinstance(shape, str) else "JSON"
        return _range(what, self.schema.get("minItems"), self.schema.get("maxItems"), " items")


def _range(what: str, low: Any, high: Any, unit: str) -> str:
    if low is not None and high is not None:
        return f"{what} {low} to {high}{unit}".strip()
    if low is not None:
        return f"{what} at least {low}{unit}".strip()
    if high is not None:
        return f"{what} at most {high}{unit}".strip()
    return what


def _kind(schema: Mapping[str, Any]) -> str:
    declared = schema.get("type")
    kinds = [declared] if isinstance(declared, str) else list(declared or [])
    # ``[integer, null]``: the field is an integer; left empty, it is left out.
    kinds = [kind for kind in kinds if kind != "null"]
    return kinds[0] if len(kinds) == 1 and kinds[0] in SCALARS else "json"


def fields_of(schema: Mapping[str, Any] | None) -> list[FormField]:
    """One field per top-level property: the required ones first, in the order ``required``
    lists them, then the others by name (a stored definition keeps no key order: PostgreSQL's
    ``jsonb`` sorts keys its own way). None without a schema: the form is then one JSON
    textarea."""
    if not schema:
        return []
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = [name for name in dict.fromkeys(schema.get("required", [])) if name in properties]
    optional = sorted(name for name in properties if name not in required)
    return [
        FormField(name, _kind(properties[name]), name in required, properties[name])
        for name in required + optional
    ]


def field_of(path: str | None, fields: list[FormField]) -> str | None:
    """The form field a validation error's ``args.…`` path falls in (``args.tags[0]`` is
    ``tags``), or ``None`` when it names none of them."""
    if not path or not path.startswith("args."):
        return None
    rest = path.removeprefix("args.")
    for field in sorted(fields, key=lambda one: len(one.name), reverse=True):
        if rest == field.name or rest.startswith((f"{field.name}.", f"{field.name}[")):
            return field.name
    return None


def _parse(field: FormField, raw: str) -> Any:
    """The typed value of a field's text (raises :class:`ValueError` naming what it wanted)."""
    if field.enum is not None:
        for option in field.enum:
            if as_text(option) == raw:
                return option
        raise ValueError("is not one of the listed values")
    if field.kind == "boolean":
        if raw not in ("true", "false"):
            raise ValueError("must be true or false")
        return raw == "true"
    if field.kind == "string":
        return raw
    try:
        if field.kind == "integer":
            return int(raw)
        if field.kind == "number":
            return float(raw)
        return json.loads(raw)
    except ValueError:
        wanted = {"integer": "a whole number", "number": "a number"}.get(field.kind, "JSON")
        raise ValueError(f"{raw[:40]!r} is not {wanted}") from None


def read(form: Mapping[str, str], fields: list[FormField]) -> tuple[dict[str, Any], dict[str, str]]:
    """The launch's args from the submitted form, and the error of each field that has one
    (``{name: "args.name: message"}``), every field checked. A field left empty is left out.

    Without fields, the args are the ``args`` textarea's JSON object (its error under
    ``args``).
    """
    if not fields:
        text = form.get("args", "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return {}, {"args": f"args: is not JSON: {exc.msg}"}
        if not isinstance(value, dict):
            return {}, {"args": "args: must be a JSON object of the workflow's args"}
        return value, {}
    args: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields:
        raw = form.get(f"arg.{field.name}", "")
        if field.kind != "string" or field.enum is not None:
            raw = raw.strip()
        if raw == "":
            if field.required:
                errors[field.name] = f"args.{field.name}: is required"
            continue
        try:
            value = _parse(field, raw)
            args_schema.check(field.schema, value, f"args.{field.name}")
        except ValidationError as exc:
            errors[field.name] = str(exc)
            continue
        except ValueError as exc:
            errors[field.name] = f"args.{field.name}: {exc}"
            continue
        args[field.name] = value
    return args, errors
