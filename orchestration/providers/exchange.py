"""One bounded, classified HTTP call to a provider (or the webhook).

:class:`Exchange` serves the http and langgraph providers and the webhook: one
:class:`~orchestration.providers.transport.Deadline` bounds a whole call, DNS to last byte,
however the server behaves. Outages (connect error, timeout, 5xx, 408, 429) raise
``RetryableProviderError``; refusals (other 4xx, a body that is not JSON) raise
``PermanentProviderError``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

from orchestration.core.egress import AllowList, Resolver, parse_allow_list, system_resolver
from orchestration.core.errors import PermanentProviderError, RetryableProviderError
from orchestration.core.settings import Settings
from orchestration.limits import secrets
from orchestration.limits.host_lookups import LaunchChecks, check_launch_url, shared_deadline
from orchestration.providers import budget
from orchestration.providers import headers as header_rules
from orchestration.providers.base import JSON
from orchestration.providers.request_budget import Body, RequestBudget, fill_body
from orchestration.providers.transport import Deadline, bounded_client

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
    """A response the caller asked to see: its status code and JSON body (``None`` if empty;
    its text when the caller asked for it ``raw``), and its headers."""

    status: int
    body: JSON
    headers: Mapping[str, str] = field(default_factory=dict)


class Exchange:
    """HTTP calls that share one deadline, so a provider call never outlasts its bound.

    Outages (connect error, timeout, 5xx, 408, 429) raise ``RetryableProviderError``; refusals
    (other 4xx, a body that is not JSON) raise ``PermanentProviderError``. Connection failures
    are retried twice while time is left, since nothing reached the server; 502/503/504 only
    when the caller says the request is safe to repeat.
    """

    def __init__(self, client: httpx.Client, deadline: Deadline, settings: Settings) -> None:
        self._client = client
        self._deadline = deadline
        self._bound = deadline.bound
        self._settings = settings

    def remaining(self) -> float:
        """Seconds left of the call's bound (negative once it is spent)."""
        return self._deadline.remaining()

    def redact(self, text: str) -> str:
        """``text`` with every declared secret replaced, fit for an error message."""
        return secrets.redact(text, self._settings)

    def send(
        self,
        method: str,
        url: str,
        *,
        what: str,
        json_body: JSON = None,
        content: Body | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        accept: Collection[int] = (),
        repeatable: bool = True,
        charged: RequestBudget | None = None,
        raw: bool = False,
        until: Callable[[bytes], bool] | None = None,
    ) -> Reply:
        """One request; a 2xx or a status in ``accept`` is returned, anything else raises.

        The request is bounded before it is built: the URL, the headers, the query and the
        body are charged to one ``ORCH_MAX_REQUEST_BYTES`` budget: ``charged``, which the
        caller has charged already for what it rendered (the URL and a ``content``), or a
        fresh one that starts with the URL. ``content`` is a JSON body already rendered;
        ``json_body`` is rendered here. Headers are checked again as a workflow may write
        them (no framing or routing header, no CR/LF/NUL); the engine's ``Accept-Encoding``
        wins. ``raw`` returns the body as text, unparsed (an event stream, say). ``until``
        sees a 2xx answer's body chunk by chunk as it arrives, and ends the read (and the
        connection) early by returning ``True``: an event stream whose server waits on the
        caller, say; the deadline and the size guard hold for it as for any read."""
        budget = charged
        if budget is None:
            budget = RequestBudget(self._settings.max_request_bytes, what)
            budget.charge(len(url.encode()))
        sent = header_rules.merged(headers or {}, {"Accept-Encoding": "identity"})
        problem = header_rules.first_problem(headers or {})
        if problem is not None:
            raise PermanentProviderError(f"{what}: refused before sending: {problem}")
        budget.charge(header_rules.size(sent.items()))
        if params:
            budget.charge(len(urlencode(params, doseq=True)) + 1)
        if json_body is not None:
            content = fill_body(json_body, {}, budget)
        if content is not None:
            # Its length given, the body goes as it was charged, piece by piece, never joined.
            sent = header_rules.merged(
                {"Content-Type": "application/json"}, sent, {"Content-Length": str(content.size)}
            )
        try:
            request = self._client.build_request(
                method, url, content=content, headers=sent, params=params
            )
        except httpx.InvalidURL as exc:
            raise PermanentProviderError(self.redact(f"{what}: {url}: {exc}")) from None
        delays = iter(_RETRY_DELAYS)
        while True:
            got = self._once(request, until)
            retry = got is None or (repeatable and got[0] in _RETRY_STATUSES)
            delay = next(delays, None) if retry else None
            if delay is not None and self._deadline.remaining() > delay:
                time.sleep(delay)
                continue
            if got is None:
                raise RetryableProviderError(self.redact(f"{what}: cannot reach {url}"))
            return self._reply(what, method, url, *got, accept, raw)

    def _once(
        self, request: httpx.Request, until: Callable[[bytes], bool] | None
    ) -> tuple[int, bytes, httpx.Headers] | None:
        """Status and body, or ``None`` when no connection could be made (nothing was sent).

        The body is read raw and only while it stays under :data:`MAX_RESPONSE_BYTES` and
        the deadline: an answer that says it is bigger is not read at all, and a compressed
        one is refused (a small gzip bomb would inflate past the guard in one chunk).
        """
        what = f"{request.method} {request.url}"
        remaining = self._deadline.remaining()
        if remaining <= 0:
            raise RetryableProviderError(
                self.redact(f"{what}: no time left within {round(self._bound, 2)}s")
            )
        request.extensions["timeout"] = httpx.Timeout(remaining).as_dict()
        try:
            response = self._client.send(request, stream=True)
            try:
                _check_framing(what, response)
                early = until if 200 <= response.status_code < 300 else None
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_raw():
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise PermanentProviderError(f"{what}: answer over {MAX_RESPONSE_BYTES} B")
                    if self._deadline.remaining() <= 0:
                        raise httpx.ReadTimeout("answer still arriving at the deadline")
                    if early is not None and early(chunk):
                        break
            finally:
                response.close()
        except httpx.ConnectError:
            return None
        except httpx.TimeoutException as exc:
            raise RetryableProviderError(
                self.redact(f"{what}: no answer within {round(self._bound, 2)}s ({exc})")
            ) from None
        except httpx.UnsupportedProtocol as exc:
            raise PermanentProviderError(self.redact(f"{what}: {exc}")) from None
        except httpx.TransportError as exc:
            raise RetryableProviderError(
                self.redact(f"{what}: connection failed ({exc})")
            ) from None
        return response.status_code, b"".join(chunks), response.headers

    def _reply(
        self,
        what: str,
        method: str,
        url: str,
        status: int,
        content: bytes,
        headers: httpx.Headers,
        accept: Collection[int],
        raw: bool,
    ) -> Reply:
        text = content.decode("utf-8", errors="replace")
        if not (200 <= status < 300 or status in accept):
            snippet = self.redact(text.strip())[:_SNIPPET_CHARS]
            message = f"{what}: {method} {url} answered {status}: {snippet or '(empty body)'}"
            if status >= 500 or status in _TRANSIENT_CLIENT_STATUSES:
                raise RetryableProviderError(message)
            raise PermanentProviderError(message)
        if raw:
            return Reply(status, text, dict(headers))
        try:
            return Reply(status, json.loads(text) if text.strip() else None, dict(headers))
        except json.JSONDecodeError:
            if status in accept:
                return Reply(status, None, dict(headers))
            snippet = self.redact(text.strip())[:_SNIPPET_CHARS]
            raise PermanentProviderError(
                f"{what}: {method} {url} answered {status} with a body that is not JSON: {snippet}"
            ) from None


def _check_framing(what: str, response: httpx.Response) -> None:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise PermanentProviderError(
            f"{what}: answered with Content-Encoding {encoding!r}; only identity is accepted"
        )
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_RESPONSE_BYTES:
        raise PermanentProviderError(
            f"{what}: answer of {length} B announced, over {MAX_RESPONSE_BYTES} B"
        )


def allow_list(settings: Settings) -> AllowList:
    """``ORCH_PROVIDER_HOSTS``, parsed (validated when the settings were loaded)."""
    return parse_allow_list(settings.provider_hosts)


@contextmanager
def exchange(
    settings: Settings,
    *,
    bound: float | None = None,
    allow: AllowList | None = None,
    resolver: Resolver = system_resolver,
) -> Iterator[Exchange]:
    """A fresh client per call (nothing is shared across forked worker processes), all of
    it bounded by ``bound`` (default ``ORCH_PROVIDER_TIMEOUT``) and ``allow`` (default
    ``ORCH_PROVIDER_HOSTS``), and by the enclosing :mod:`budget` if any (``cancel``)."""
    deadline = Deadline(budget.clamp(settings.provider_timeout if bound is None else bound))
    chosen = allow_list(settings) if allow is None else allow
    with bounded_client(chosen, deadline, resolver) as client:
        yield Exchange(client, deadline, settings)


def check_egress(url: str, field: str, settings: Settings, resolver: Resolver) -> None:
    """Launch check of a provider URL against ``ORCH_PROVIDER_HOSTS`` (``ValidationError``);
    inside :func:`launch_checks` its lookup shares the launch's deadline."""
    check_launch_url(
        allow_list(settings), url, field, resolver=resolver, timeout=settings.launch_check_seconds
    )


def launch_checks(settings: Settings) -> AbstractContextManager[LaunchChecks]:
    """The block in which one workflow's URLs are checked: its lookups run concurrently and
    share ``ORCH_LAUNCH_CHECK_SECONDS``, at most ``ORCH_MAX_LAUNCH_HOSTS`` names."""
    return shared_deadline(settings.launch_check_seconds, settings.max_launch_hosts)
