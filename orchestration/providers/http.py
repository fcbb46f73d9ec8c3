"""The http provider: any agent service with start, status and cancel endpoints.

Each endpoint is a request spec (``url``, ``method``, ``headers``, JSON ``body`` template);
dotted paths pick the run id, status word, output, error and prompt out of the answers, and
``status_map`` turns the service's words into ours. Options are stored in the run's row, so a
secret header is ``{env: NAME, prefix: "..."}``, resolved at call time and redacted from
errors. ``start`` sends the turn key as ``Idempotency-Key``; the service must honour it (a
second start with the same key answers the first turn's id), which also makes a retry safe.

:class:`Exchange`, the bounded and classified HTTP call, serves the langgraph provider too.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from orchestration.errors import PermanentProviderError, RetryableProviderError, ValidationError
from orchestration.providers.base import JSON, ProviderStatus, TurnRef, TurnRequest, TurnStatus
from orchestration.settings import Settings

#: A guard on memory, not the output bound: no provider answer is read past this.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: Answers worth retrying within one call's time bound (the request did not take effect, or
#: taking effect twice is harmless because the call is idempotent).
_RETRY_STATUSES = frozenset({502, 503, 504})
#: Pauses before the in-call retries: a blip is absorbed, an outage is reported at once.
_RETRY_DELAYS = (0.1, 0.3)
#: Client errors that mean "later", not "never".
_TRANSIENT_CLIENT_STATUSES = frozenset({408, 429})
_SNIPPET_CHARS = 300


@dataclass(frozen=True)
class Reply:
    """A response the caller asked to see: its status code and JSON body (``None`` if empty)."""

    status: int
    body: JSON


class Exchange:
    """HTTP calls that share one deadline, so a provider call never outlasts its bound.

    Outages (connect error, timeout, 5xx, 408, 429) raise ``RetryableProviderError``; refusals
    (other 4xx, a body that is not JSON) raise ``PermanentProviderError``. Connection failures
    are retried twice while time is left, since nothing reached the server; 502/503/504 only
    when the caller says the request is safe to repeat.
    """

    def __init__(self, client: httpx.Client, bound: float, secrets: Collection[str] = ()) -> None:
        self._client = client
        self._bound = bound
        self._deadline = time.monotonic() + bound
        self._secrets = [secret for secret in secrets if secret]

    def redact(self, text: str) -> str:
        """``text`` with every resolved secret replaced, fit for an error message."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def send(
        self,
        method: str,
        url: str,
        *,
        what: str,
        json_body: JSON = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        accept: Collection[int] = (),
        repeatable: bool = True,
    ) -> Reply:
        """One request; a 2xx or a status in ``accept`` is returned, anything else raises."""
        try:
            request = self._client.build_request(
                method, url, json=json_body, headers=headers, params=params
            )
        except httpx.InvalidURL as exc:
            raise PermanentProviderError(self.redact(f"{what}: {url}: {exc}")) from None
        delays = iter(_RETRY_DELAYS)
        while True:
            got = self._once(request)
            retry = got is None or (repeatable and got[0] in _RETRY_STATUSES)
            delay = next(delays, None) if retry else None
            if delay is not None and self._deadline - time.monotonic() > delay:
                time.sleep(delay)
                continue
            if got is None:
                raise RetryableProviderError(self.redact(f"{what}: cannot reach {url}"))
            return self._reply(what, method, url, *got, accept)

    def _once(self, request: httpx.Request) -> tuple[int, bytes] | None:
        """Status and body, or ``None`` when no connection could be made (nothing was sent)."""
        what = f"{request.method} {request.url}"
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise RetryableProviderError(self.redact(f"{what}: no time left within {self._bound}s"))
        request.extensions["timeout"] = httpx.Timeout(remaining).as_dict()
        try:
            response = self._client.send(request, stream=True)
            try:
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise PermanentProviderError(f"{what}: answer over {MAX_RESPONSE_BYTES} B")
                    if time.monotonic() > self._deadline:
                        raise httpx.ReadTimeout("answer still arriving at the deadline")
            finally:
                response.close()
        except httpx.ConnectError:
            return None
        except httpx.TimeoutException as exc:
            raise RetryableProviderError(
                self.redact(f"{what}: no answer within {self._bound}s ({exc})")
            ) from None
        except httpx.UnsupportedProtocol as exc:
            raise PermanentProviderError(self.redact(f"{what}: {exc}")) from None
        except httpx.TransportError as exc:
            raise RetryableProviderError(
                self.redact(f"{what}: connection failed ({exc})")
            ) from None
        return response.status_code, b"".join(chunks)

    def _reply(
        self, what: str, method: str, url: str, status: int, raw: bytes, accept: Collection[int]
    ) -> Reply:
        text = raw.decode("utf-8", errors="replace")
        if not (200 <= status < 300 or status in accept):
            snippet = self.redact(text.strip()[:_SNIPPET_CHARS])
            message = f"{what}: {method} {url} answered {status}: {snippet or '(empty body)'}"
            if status >= 500 or status in _TRANSIENT_CLIENT_STATUSES:
                raise RetryableProviderError(message)
            raise PermanentProviderError(message)
        try:
            return Reply(status, json.loads(text) if text.strip() else None)
        except json.JSONDecodeError:
            if status in accept:
                return Reply(status, None)
            snippet = self.redact(text.strip()[:_SNIPPET_CHARS])
            raise PermanentProviderError(
                f"{what}: {method} {url} answered {status} with a body that is not JSON: {snippet}"
            ) from None


@contextmanager
def exchange(bound: float, secrets: Collection[str] = ()) -> Iterator[Exchange]:
    """A fresh client per provider call: nothing is shared across forked worker processes."""
    with httpx.Client(follow_redirects=False) as client:
        yield Exchange(client, bound, secrets)


def json_size(value: JSON) -> int:
    """Bytes of ``value`` as the engine stores it."""
    return len(json.dumps(value, ensure_ascii=False).encode())


def oversize(output: JSON, limit: int) -> str | None:
    """Why ``output`` cannot be a step's output, or ``None`` when it fits."""
    size = json_size(output)
    if size <= limit:
        return None
    return f"the output is {size} bytes, over the limit of {limit} (ORCH_MAX_OUTPUT_BYTES)"


def fill(template: JSON, values: Mapping[str, JSON]) -> JSON:
    """``template`` with ``{name}`` placeholders filled from ``values``, in one pass.

    A string that is exactly ``{name}`` becomes the value itself (any JSON); a placeholder
    inside a longer string becomes the value's text. Inserted text is never scanned again, so
    a task that happens to contain ``{key}`` stays as written.
    """
    if isinstance(template, str):
        if not values:
            return template
        pattern = re.compile("{(" + "|".join(re.escape(name) for name in values) + ")}")
        whole = pattern.fullmatch(template)
        if whole:
            return values[whole.group(1)]

        def text(match: re.Match[str]) -> str:
            value = values[match.group(1)]
            return value if isinstance(value, str) else json.dumps(value)

        return pattern.sub(text, template)
    if isinstance(template, list):
        return [fill(item, values) for item in template]
    if isinstance(template, dict):
        return {key: fill(item, values) for key, item in template.items()}
    return template


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
    parts = urlsplit(value.replace("{run_id}", "x"))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError(field, f"must be an absolute http(s) URL, not {value!r}")


def check_known(options: Mapping[str, Any], known: Collection[str], where: str = "") -> None:
    """Reject unknown option names, so a typo fails the launch and not the step."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValidationError(where + unknown[0], f"is not known; known: {', '.join(known)}")


# --- the http provider -------------------------------------------------------------------

_PATHS = ("run_id_path", "status_path", "output_path", "error_path", "prompt_path")
_OPTIONS = ("start", "status", "cancel", "resume", *_PATHS, "status_map", "headers")
_SPEC_KEYS = ("url", "method", "headers", "body")
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_DEFAULT_METHODS = {"start": "POST", "resume": "POST", "status": "GET", "cancel": "POST"}
_DEFAULT_BODY: dict[str, JSON] = {"task": "{task}"}
#: Cancelling a turn the service no longer has, or that already finished, is not an error.
_CANCEL_DONE = (404, 409, 410)


def _check_headers(headers: Any, field: str) -> None:
    if not isinstance(headers, Mapping):
        raise ValidationError(field, "must be a mapping of header name to value")
    for name, value in headers.items():
        where = f"{field}.{name}"
        if isinstance(value, str):
            continue
        if not isinstance(value, Mapping) or set(value) - {"env", "prefix"} or "env" not in value:
            raise ValidationError(
                where, "must be a string or {env: VARIABLE_NAME, prefix: optional text}"
            )
        if not isinstance(value["env"], str) or not value["env"]:
            raise ValidationError(f"{where}.env", "must name an environment variable")
        if not isinstance(value.get("prefix", ""), str):
            raise ValidationError(f"{where}.prefix", "must be a string")


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
        _check_headers(spec["headers"], f"{name}.headers")
    if name in ("status", "cancel") and "{run_id}" not in json.dumps(
        [spec["url"], spec.get("body")]
    ):
        raise ValidationError(f"{name}.url", "must contain {run_id} (in the url or the body)")


def _status_map(options: Mapping[str, Any]) -> dict[str, ProviderStatus]:
    raw = options.get("status_map")
    if raw is None:
        return {status.value: status for status in ProviderStatus}
    return {str(word): ProviderStatus(value) for word, value in raw.items()}


class HttpProvider:
    """See the module docstring."""

    name = "http"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def validate(self, options: Mapping[str, Any]) -> None:
        check_known(options, _OPTIONS)
        for name in ("start", "status", "cancel"):
            _check_spec(options, name)
        if "resume" in options:
            _check_spec(options, "resume")
        if "headers" in options:
            _check_headers(options["headers"], "headers")
        for name in _PATHS:
            value = options.get(name)
            needed = value is not None or name in ("run_id_path", "status_path")
            if needed and not (isinstance(value, str) and value):
                raise ValidationError(name, "must be a dotted path such as data.id")
        status_map = options.get("status_map")
        if status_map is None:
            return
        words = sorted(status.value for status in ProviderStatus)
        if not isinstance(status_map, Mapping) or not status_map:
            raise ValidationError("status_map", f"must map the service's words to {words}")
        for word, value in status_map.items():
            if value not in words:
                raise ValidationError(f"status_map.{word}", f"must be one of {words}")

    def _headers(self, options: Mapping[str, Any], name: str) -> tuple[dict[str, str], list[str]]:
        """The request's headers with secrets resolved, and the secrets (for redaction)."""
        merged = {**options.get("headers", {}), **options[name].get("headers", {})}
        headers: dict[str, str] = {}
        secrets: list[str] = []
        for header, value in merged.items():
            if isinstance(value, str):
                headers[header] = value
                continue
            secret = os.environ.get(value["env"])
            if not secret:
                raise PermanentProviderError(
                    f"http: header {header} needs the environment variable {value['env']}, "
                    "which is not set on this worker"
                )
            secrets.append(secret)
            headers[header] = value.get("prefix", "") + secret
        return headers, secrets

    def _call(
        self,
        options: Mapping[str, Any],
        name: str,
        values: Mapping[str, JSON],
        *,
        extra_headers: Mapping[str, str] | None = None,
        accept: Collection[int] = (),
    ) -> Reply:
        spec = options[name]
        headers, secrets = self._headers(options, name)
        headers.update(extra_headers or {})
        url_values = {key: quote(str(value), safe="") for key, value in values.items()}
        url = str(fill(spec["url"], url_values))
        method = str(spec.get("method", _DEFAULT_METHODS[name])).upper()
        body = spec.get("body", _DEFAULT_BODY if name in ("start", "resume") else None)
        with exchange(self._settings.provider_timeout, secrets) as http:
            return http.send(
                method,
                url,
                what=f"http {name}",
                json_body=None if body is None else fill(body, values),
                headers=headers,
                accept=accept,
            )

    def start(self, request: TurnRequest) -> str:
        options = request.options
        name = "resume" if request.resuming and "resume" in options else "start"
        values = {"task": request.input, "key": request.key, "resume": request.resume}
        reply = self._call(options, name, values, extra_headers={"Idempotency-Key": request.key})
        found, run_id = pick(reply.body, options["run_id_path"])
        if not found or not isinstance(run_id, str | int) or isinstance(run_id, bool):
            raise PermanentProviderError(
                f"http {name}: the answer has no run id at {options['run_id_path']!r}: "
                f"{json.dumps(reply.body)[:_SNIPPET_CHARS]}"
            )
        return str(run_id)

    def status(self, ref: TurnRef) -> TurnStatus:
        if ref.provider_run_id is None:
            raise PermanentProviderError(
                "http status: the turn has no provider run id (start never answered)"
            )
        options = ref.options
        reply = self._call(options, "status", {"run_id": ref.provider_run_id, "key": ref.key})
        found, word = pick(reply.body, options["status_path"])
        if not found or not isinstance(word, str):
            raise PermanentProviderError(
                f"http status: the answer has no status word at {options['status_path']!r}: "
                f"{json.dumps(reply.body)[:_SNIPPET_CHARS]}"
            )
        known = _status_map(options)
        if word not in known:
            raise PermanentProviderError(
                f"http status: the service said {word!r}, which status_map does not know; "
                f"known words: {', '.join(sorted(known))}"
            )
        return self._status(known[word], word, reply.body, options)

    def _status(
        self, status: ProviderStatus, word: str, body: JSON, options: Mapping[str, Any]
    ) -> TurnStatus:
        def at(name: str) -> JSON:
            return pick(body, options[name])[1] if name in options else None

        if status in (ProviderStatus.COMPLETED, ProviderStatus.IDLE):
            output = at("output_path")
            too_big = oversize(output, self._settings.max_output_bytes)
            if too_big:
                return TurnStatus(ProviderStatus.FAILED, raw=word, error=too_big)
            return TurnStatus(status, raw=word, output=output)
        if status is ProviderStatus.FAILED:
            error = at("error_path")
            text = error if isinstance(error, str) else json.dumps(error)
            return TurnStatus(status, raw=word, error=text if error is not None else word)
        if status is ProviderStatus.INPUT_REQUIRED:
            return TurnStatus(status, raw=word, prompt=at("prompt_path"))
        return TurnStatus(status, raw=word)

    def cancel(self, ref: TurnRef) -> None:
        # Without a run id there is nothing to address; asking start again would begin a turn.
        if ref.provider_run_id is None:
            return
        values = {"run_id": ref.provider_run_id, "key": ref.key}
        self._call(ref.options, "cancel", values, accept=_CANCEL_DONE)

    def snapshot(self, ref: TurnRef) -> JSON:
        observed = self.status(ref)
        return {"status": observed.raw, "output": observed.output}
