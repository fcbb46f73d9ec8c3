"""The http provider: any agent service with start, status and cancel endpoints.

Each endpoint is a request spec (``url``, ``method``, ``headers``, JSON ``body`` template);
dotted paths pick the run id, status word, output, error and prompt out of the answers, and
``status_map`` turns the service's words into ours. Options are stored in the run's row, so a
secret header is ``{secret: NAME, prefix: "..."}`` (``env:`` is the older spelling), resolved
at call time from the worker's environment and redacted from errors. A secret must be
declared in ``ORCH_PROVIDER_SECRETS`` for the hosts of every URL it is sent to, and every URL
must be inside ``ORCH_PROVIDER_HOSTS``; both are checked at launch and again at call time.
``start`` sends the turn key as ``Idempotency-Key``; the service must honour it (a second
start with the same key answers the first turn's id), which also makes a retry safe.
``status`` and ``cancel`` address a turn by ``{run_id}`` or by ``{key}``; only ``{key}`` can
reach a turn whose start timed out after it was sent (its run id is unknown).

The bounded call itself is :mod:`orchestration.providers.exchange`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from orchestration.core.egress import Resolver, system_resolver
from orchestration.core.errors import LimitExceeded, PermanentProviderError, ValidationError
from orchestration.core.settings import Settings
from orchestration.limits import secrets
from orchestration.providers import headers as header_rules
from orchestration.providers.base import (
    JSON,
    Evidence,
    ProviderStatus,
    TurnRef,
    TurnRequest,
    TurnStatus,
)
from orchestration.providers.exchange import Reply, check_egress, exchange
from orchestration.providers.request_budget import (
    MAX_PLACEHOLDERS,
    PLACEHOLDER,
    RequestBudget,
    count,
    fill_body,
    fill_url,
)

_SNIPPET_CHARS = 300


def json_size(value: JSON) -> int:
    """Bytes of ``value`` as the engine stores it."""
    return len(json.dumps(value, ensure_ascii=False).encode())


def pick(document: JSON, path: str) -> tuple[bool, JSON]:
    """Follow a dotted path (``a.b.0.c``); ``(False, None)`` when it leads nowhere."""
    current = document
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return False, None
    return True, current


def check_url(value: Any, field: str) -> None:
    """An absolute http(s) URL, or a ``ValidationError`` naming ``field``."""
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "is required: an http(s) URL")
    parts = urlsplit(PLACEHOLDER.sub("x", value))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError(field, f"must be an absolute http(s) URL, not {value!r}")


def check_known(options: Mapping[str, Any], known: Collection[str], where: str = "") -> None:
    """Reject unknown option names, so a typo fails the launch and not the step."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValidationError(where + unknown[0], f"is not known; known: {', '.join(known)}")


# --- the http provider -------------------------------------------------------------------

_PATHS = ("run_id_path", "status_path", "output_path", "error_path", "prompt_path")
_OPTIONS = (
    "start",
    "status",
    "cancel",
    "resume",
    *_PATHS,
    "status_map",
    "headers",
    "version",
    "version_path",
)
_SPEC_KEYS = ("url", "method", "headers", "body")
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_DEFAULT_METHODS = {
    "start": "POST",
    "resume": "POST",
    "status": "GET",
    "cancel": "POST",
    "version": "GET",
}
_DEFAULT_BODY: dict[str, JSON] = {"task": "{task}"}
#: The values each endpoint fills in (its other ``{name}`` stay as written).
_FILLED = {
    "start": ("task", "key", "resume"),
    "resume": ("task", "key", "resume"),
    "status": ("run_id", "key"),
    "cancel": ("run_id", "key"),
    "version": (),
}
#: Cancelling a turn the service no longer has, or that already finished, is not an error.
_CANCEL_DONE = (404, 409, 410)
#: The two spellings of a secret header's name.
_SECRET_KINDS = ("secret", "env")


def secret_kind(value: Mapping[str, Any]) -> str:
    """How a secret header value names its secret: ``secret`` (or the older ``env``)."""
    return next(kind for kind in _SECRET_KINDS if kind in value)


def check_url_egress(options: Mapping[str, Any], settings: Settings, resolver: Resolver) -> None:
    """Launch check of a provider called at one ``url`` (a2a, mcp): its ``headers``, the URL
    against the egress rules, and each secret header bound to that URL."""
    if "headers" in options:
        check_headers(options["headers"], "headers")
    url = str(options["url"])
    check_egress(url, "url", settings, resolver)
    for header, value in (options.get("headers") or {}).items():
        if isinstance(value, Mapping):
            kind = secret_kind(value)
            field = f"headers.{header}.{kind}"
            secrets.check_bound(str(value[kind]), {"url": url}, field, settings)


def url_headers(
    options: Mapping[str, Any], settings: Settings, provider: str, first: Mapping[str, str] = {}
) -> dict[str, str]:
    """``first``, then the step's ``headers`` for one ``url`` (a2a, mcp): each secret checked
    against that URL and resolved."""
    url = str(options["url"])
    headers = dict(first)
    for header, value in (options.get("headers") or {}).items():
        if isinstance(value, str):
            headers[header] = value
        else:
            resolved = secrets.secret_value(str(value[secret_kind(value)]), url, settings, provider)
            headers[header] = str(value.get("prefix", "")) + resolved
    return headers


def check_headers(headers: Any, field: str) -> None:
    """Launch check of a ``headers`` mapping: each value a literal string or a secret's name
    (``{secret: NAME, prefix: ...}``), each name and value fit to send."""
    if not isinstance(headers, Mapping):
        raise ValidationError(field, "must be a mapping of header name to value")
    for name, value in headers.items():
        where = f"{field}.{name}"
        problem = (
            header_rules.name_problem(name)
            if isinstance(name, str)
            else "must be a header name as text, such as X-Request-Id"
        )
        if problem is not None:
            raise ValidationError(where, problem)
        if isinstance(value, str):
            problem = header_rules.value_problem(value)
            if problem is not None:
                raise ValidationError(where, problem)
            continue
        kinds = [kind for kind in _SECRET_KINDS if isinstance(value, Mapping) and kind in value]
        if (
            not isinstance(value, Mapping)
            or len(kinds) != 1
            or set(value) - {*_SECRET_KINDS, "prefix"}
        ):
            raise ValidationError(
                where, "must be a string or {secret: NAME, prefix: optional text}"
            )
        if not isinstance(value[kinds[0]], str) or not value[kinds[0]]:
            raise ValidationError(f"{where}.{kinds[0]}", "must name a secret")
        prefix = value.get("prefix", "")
        if not isinstance(prefix, str):
            raise ValidationError(f"{where}.prefix", "must be a string")
        problem = header_rules.value_problem(prefix)
        if problem is not None:
            raise ValidationError(f"{where}.prefix", problem)


def _uses(spec: Mapping[str, Any], placeholder: str) -> bool:
    return "{" + placeholder + "}" in json.dumps([spec["url"], spec.get("body")])


def _check_spec(options: Mapping[str, Any], name: str) -> None:
    spec = options.get(name)
    if not isinstance(spec, Mapping):
        raise ValidationError(name, "is required: a mapping with url (and method, headers, body)")
    check_known(spec, _SPEC_KEYS, f"{name}.")
    check_url(spec.get("url"), f"{name}.url")
    method = spec.get("method", _DEFAULT_METHODS[name])
    if not isinstance(method, str) or method.upper() not in _METHODS:
        raise ValidationError(f"{name}.method", f"must be one of {', '.join(_METHODS)}")
    if "headers" in spec:
        check_headers(spec["headers"], f"{name}.headers")
    if name in ("status", "cancel") and not (_uses(spec, "run_id") or _uses(spec, "key")):
        raise ValidationError(
            f"{name}.url", "must contain {run_id} or {key} (in the url or the body)"
        )


def _status_map(options: Mapping[str, Any]) -> dict[str, ProviderStatus]:
    raw = options.get("status_map")
    if raw is None:
        return {status.value: status for status in ProviderStatus}
    return {str(word): ProviderStatus(value) for word, value in raw.items()}


def _secret_headers(
    options: Mapping[str, Any], name: str
) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """Each secret header endpoint ``name`` sends: its option field, header and value (the
    top-level headers apply to every endpoint unless the endpoint sets the same header, in
    any case)."""
    own = options[name].get("headers", {})
    mine = {header.lower() for header in own}
    for header, value in header_rules.merged(options.get("headers", {}), own).items():
        if isinstance(value, Mapping):
            where = f"{name}.headers" if header.lower() in mine else "headers"
            yield f"{where}.{header}.{secret_kind(value)}", header, value


def _body(options: Mapping[str, Any], name: str) -> JSON:
    """The body template endpoint ``name`` sends (``None``: no body)."""
    return options[name].get("body", _DEFAULT_BODY if name in ("start", "resume") else None)


def _check_size(options: Mapping[str, Any], endpoints: list[str], settings: Settings) -> None:
    """Refuse, at launch, templates that name more than :data:`MAX_PLACEHOLDERS` values, or
    whose requests the values they name would take over ``ORCH_MAX_REQUEST_BYTES`` (each
    placeholder counted at its value's bound; the charge while rendering is the guarantee)."""
    bounds = {
        "task": (settings.max_rendered_task_bytes, "ORCH_MAX_RENDERED_TASK_BYTES"),
        "resume": (settings.max_args_bytes, "ORCH_MAX_ARGS_BYTES"),
    }
    total = 0
    for name in endpoints:
        spec = options[name]
        templates = [spec["url"], _body(options, name)]
        filled = _FILLED[name]
        total += sum(count(template, filled, f"{name}.body") for template in templates)
        if total > MAX_PLACEHOLDERS:
            raise LimitExceeded(
                name,
                f"the options hold over {MAX_PLACEHOLDERS} placeholders, the most one step's "
                "options may hold",
            )
        size = len(json.dumps(spec, ensure_ascii=False).encode())
        for value, (bound, setting) in bounds.items():
            times = sum(count(template, (value,), name) for template in templates)
            if value in filled and times and size + times * bound > settings.max_request_bytes:
                raise LimitExceeded(
                    name,
                    f"names {{{value}}} {times} times: with the value up to {bound} bytes "
                    f"({setting}) its request could be {size + times * bound} bytes, over "
                    f"the limit of {settings.max_request_bytes} (ORCH_MAX_REQUEST_BYTES)",
                )


class HttpProvider:
    """See the module docstring. ``resolver`` maps host names to addresses (tests inject
    one; the system's by default) for the launch and connect-time checks."""

    name = "http"

    def __init__(self, settings: Settings, resolver: Resolver = system_resolver) -> None:
        self._settings = settings
        self._resolver = resolver

    def validate(self, options: Mapping[str, Any]) -> None:
        check_known(options, _OPTIONS)
        endpoints = ["start", "status", "cancel"]
        endpoints += [name for name in ("resume", "version") if name in options]
        for name in endpoints:
            _check_spec(options, name)
        if "headers" in options:
            check_headers(options["headers"], "headers")
        for name in (*_PATHS, "version_path"):
            value = options.get(name)
            needed = value is not None or name in ("run_id_path", "status_path")
            needed = needed or (name == "version_path" and "version" in options)
            if needed and not (isinstance(value, str) and value):
                raise ValidationError(name, "must be a dotted path such as data.id")
        status_map = options.get("status_map")
        if status_map is not None:
            words = sorted(status.value for status in ProviderStatus)
            if not isinstance(status_map, Mapping) or not status_map:
                raise ValidationError("status_map", f"must map the service's words to {words}")
            for word, value in status_map.items():
                if value not in words:
                    raise ValidationError(f"status_map.{word}", f"must be one of {words}")
        _check_size(options, endpoints, self._settings)
        for name in endpoints:
            url = options[name]["url"]
            check_egress(url, f"{name}.url", self._settings, self._resolver)
            for field, _header, value in _secret_headers(options, name):
                secret = value[secret_kind(value)]
                secrets.check_bound(secret, {f"{name}.url": url}, field, self._settings)

    def _headers(self, options: Mapping[str, Any], name: str, url: str) -> dict[str, str]:
        """The request's headers, with each secret checked against ``url`` and resolved."""
        merged = header_rules.merged(options.get("headers", {}), options[name].get("headers", {}))
        headers = {header: value for header, value in merged.items() if isinstance(value, str)}
        for _field, header, value in _secret_headers(options, name):
            secret = value[secret_kind(value)]
            resolved = secrets.secret_value(secret, url, self._settings, f"http {name}")
            headers[header] = value.get("prefix", "") + resolved
        return headers

    def _call(
        self,
        options: Mapping[str, Any],
        name: str,
        values: Mapping[str, JSON],
        *,
        extra_headers: Mapping[str, str] | None = None,
        accept: Collection[int] = (),
    ) -> Reply:
        """One endpoint's request, rendered within ``ORCH_MAX_REQUEST_BYTES`` (URL, then
        body; the exchange charges the headers) before anything is sent."""
        spec = options[name]
        what = f"http {name}"
        budget = RequestBudget(self._settings.max_request_bytes, what)
        url = fill_url(spec["url"], values, budget)
        headers = header_rules.merged(self._headers(options, name, url), extra_headers or {})
        method = str(spec.get("method", _DEFAULT_METHODS[name])).upper()
        body = _body(options, name)
        content = None if body is None else fill_body(body, values, budget)
        with exchange(self._settings, resolver=self._resolver) as http:
            return http.send(
                method,
                url,
                what=what,
                content=content,
                headers=headers,
                accept=accept,
                charged=budget,
            )

    def start(self, request: TurnRequest) -> str:
        options = request.options
        name = "resume" if request.resuming and "resume" in options else "start"
        values = {"task": request.input, "key": request.key, "resume": request.resume}
        headers = {"Idempotency-Key": request.key}
        if request.deadline is not None:
            # The latest moment the turn may begin, for a service that can tell when the
            # request arrived (answering 408 after it); see ``TurnRequest.deadline``.
            headers["Request-Deadline"] = request.deadline.isoformat(timespec="milliseconds")
        reply = self._call(options, name, values, extra_headers=headers)
        found, run_id = pick(reply.body, options["run_id_path"])
        if not found or not isinstance(run_id, str | int) or isinstance(run_id, bool):
            raise PermanentProviderError(
                f"http {name}: the answer has no run id at {options['run_id_path']!r}: "
                f"{self._shown(reply.body)}"
            )
        return str(run_id)

    def describe(self, options: Mapping[str, Any]) -> Evidence:
        """The service's host, and its version when the spec names where to read it: a
        ``version`` request (a GET by default) whose JSON answer holds it at
        ``version_path``. Without them the service states no version (nothing to pin)."""
        name = urlsplit(str(options["start"]["url"])).netloc
        if "version" not in options:
            return Evidence(name=name, version=None)
        path = str(options["version_path"])
        reply = self._call(options, "version", {})
        found, value = pick(reply.body, path)
        if not found or value is None or isinstance(value, dict | list):
            raise PermanentProviderError(
                f"http version: the answer has no version at {path!r}: {self._shown(reply.body)}"
            )
        return Evidence(name=name, version=str(value), detail={"version_path": path})

    def _shown(self, body: JSON) -> str:
        """A service's answer as an error quotes it: redacted, then cut."""
        return secrets.redact(json.dumps(body), self._settings)[:_SNIPPET_CHARS]

    def _address(self, ref: TurnRef, name: str) -> dict[str, JSON]:
        """The values that name the turn for ``status``/``cancel``; without a run id only an
        endpoint written with ``{key}`` alone can reach it."""
        if ref.provider_run_id is not None:
            return {"run_id": ref.provider_run_id, "key": ref.key}
        if _uses(ref.options[name], "run_id"):
            raise PermanentProviderError(
                f"http {name}: the turn has no provider run id (its start never answered) and "
                f"{name}.url addresses turns by {{run_id}}, so the turn cannot be addressed; "
                f"write {name}.url with {{key}} (the Idempotency-Key) to reach such turns"
            )
        return {"key": ref.key}

    def status(self, ref: TurnRef) -> TurnStatus:
        options = ref.options
        reply = self._call(options, "status", self._address(ref, "status"))
        found, word = pick(reply.body, options["status_path"])
        if not found or not isinstance(word, str):
            raise PermanentProviderError(
                f"http status: the answer has no status word at {options['status_path']!r}: "
                f"{self._shown(reply.body)}"
            )
        known = _status_map(options)
        if word not in known:
            raise PermanentProviderError(
                f"http status: the service said {secrets.redact(repr(word), self._settings)}, "
                "which status_map does not know; "
                f"known words: {', '.join(sorted(known))}"
            )
        return self._status(known[word], word, reply.body, options)

    def _status(
        self, status: ProviderStatus, word: str, body: JSON, options: Mapping[str, Any]
    ) -> TurnStatus:
        def at(name: str) -> JSON:
            return pick(body, options[name])[1] if name in options else None

        if status in (ProviderStatus.COMPLETED, ProviderStatus.IDLE):
            # Its size is the engine's to judge (``over_limit``), like every returned value.
            return TurnStatus(status, raw=word, output=at("output_path"))
        if status is ProviderStatus.FAILED:
            error = at("error_path")
            text = error if isinstance(error, str) else json.dumps(error)
            return TurnStatus(status, raw=word, error=text if error is not None else word)
        if status is ProviderStatus.INPUT_REQUIRED:
            return TurnStatus(status, raw=word, prompt=at("prompt_path"))
        return TurnStatus(status, raw=word)

    def cancel(self, ref: TurnRef) -> None:
        self._call(ref.options, "cancel", self._address(ref, "cancel"), accept=_CANCEL_DONE)

    def snapshot(self, ref: TurnRef) -> JSON:
        observed = self.status(ref)
        return {"status": observed.raw, "output": observed.output}
