"""MCP's streamable HTTP transport, one bounded exchange at a time: JSON-RPC requests POSTed to
the server's endpoint, answered with JSON or with an event stream whose ``message`` events carry
the response, inside a session the server names in ``Mcp-Session-Id``.

A :class:`Wire` speaks for one provider call: it opens a session (``initialize``, then
``notifications/initialized``) or resumes the session a turn's task lives in (tasks are bound
to the session that made them), and sends every request through the caller's
:class:`~orchestration.providers.exchange.Exchange`, so the egress rules, the secret binding,
the byte budget and the call's hard deadline hold for each.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from orchestration.core.errors import PermanentProviderError, RetryableProviderError
from orchestration.core.settings import Settings
from orchestration.limits import secrets
from orchestration.providers.base import JSON
from orchestration.providers.exchange import Exchange
from orchestration.providers.request_budget import RequestBudget, Verbatim, fill_body

#: The protocol version this provider asks for (the one that has tasks).
PROTOCOL = "2025-11-25"
#: Versions a server may answer with that this provider can speak (tasks need the first).
SPOKEN = ("2025-11-25", "2025-06-18", "2025-03-26")
#: JSON-RPC error codes a caller acts on.
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
_INTERNAL = -32603
_ACCEPT = "application/json, text/event-stream"
_SNIPPET_CHARS = 300
CLIENT = {"name": "orchestration", "version": "0.1.0"}


@dataclass(frozen=True)
class Answer:
    """A JSON-RPC answer: its ``result``, or the error code (and message) it came with."""

    result: JSON = None
    code: int | None = None
    message: str = ""


@dataclass(frozen=True)
class ServerInfo:
    """What ``initialize`` said: who the server is and whether it runs tool calls as tasks."""

    name: str | None
    version: str | None
    protocol: str
    tasks: bool


class Wire:
    """JSON-RPC over streamable HTTP within one exchange (see the module docstring)."""

    def __init__(
        self, http: Exchange, url: str, headers: Mapping[str, str], settings: Settings
    ) -> None:
        self._http = http
        self._url = url
        self._headers = {**headers, "Accept": _ACCEPT}
        self._settings = settings
        self._next_id = 0
        self.session: str | None = None

    def remaining(self) -> float:
        """Seconds left of the call's bound."""
        return self._http.remaining()

    def shown(self, value: Any) -> str:
        """What a server said, as an error quotes it: redacted, then cut."""
        return secrets.redact(str(value), self._settings)[:_SNIPPET_CHARS]

    # --- the session ---------------------------------------------------------------------

    def open(self) -> ServerInfo:
        """A new session: ``initialize`` (the version negotiated), then ``initialized``."""
        params = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": CLIENT}
        answer = self.call("initialize", params)
        result = answer.result if isinstance(answer.result, dict) else {}
        protocol = result.get("protocolVersion")
        if protocol not in SPOKEN:
            raise PermanentProviderError(
                f"mcp initialize: the server speaks MCP {self.shown(protocol)}, which this "
                f"provider does not ({', '.join(SPOKEN)})"
            )
        self._headers["MCP-Protocol-Version"] = str(protocol)
        info = result.get("serverInfo")
        info = info if isinstance(info, dict) else {}
        capabilities = result.get("capabilities")
        tasks = _at(capabilities, "tasks", "requests", "tools", "call") is not None
        self.notify("notifications/initialized")
        name, version = info.get("name"), info.get("version")
        return ServerInfo(
            name=self.shown(name) if isinstance(name, str) else None,
            version=self.shown(version) if isinstance(version, str) else None,
            protocol=str(protocol),
            tasks=tasks and protocol == PROTOCOL,
        )

    def resume(self, session: str | None, protocol: str) -> None:
        """Speak inside an existing session (``None``: the server keeps none)."""
        self.session = session
        self._headers["MCP-Protocol-Version"] = protocol

    def close(self) -> None:
        """End the session (the server may refuse; nothing depends on it)."""
        if self.session is None:
            return
        self._http.send(
            "DELETE",
            self._url,
            what="mcp session end",
            headers=self._sent_headers(),
            accept=(404, 405),
            raw=True,
        )
        self.session = None

    def _sent_headers(self) -> dict[str, str]:
        if self.session is None:
            return dict(self._headers)
        return {**self._headers, "Mcp-Session-Id": self.session}

    # --- requests ------------------------------------------------------------------------

    def notify(self, method: str) -> None:
        """A notification (no answer but the status)."""
        envelope = {"jsonrpc": "2.0", "method": method}
        self._post(f"mcp {method}", envelope, {}, True, {})

    def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        values: Mapping[str, JSON] | None = None,
        accept: Collection[int] = (),
        repeatable: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One request and its answer. ``params`` is sent as written unless ``values`` are
        given: then it is a template filled from them, within the request byte budget;
        ``headers`` go with this request only. An error whose code is in ``accept`` is
        returned; any other raises (an internal error as an outage, the rest as refusals)."""
        what = f"mcp {method}"
        self._next_id += 1
        request_id = self._next_id
        body = params if values is not None else Verbatim(params)
        envelope = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": body}
        text = self._post(what, envelope, values or {}, repeatable, headers or {})
        message = _response(text, request_id)
        if message is None:
            raise PermanentProviderError(
                f"{what}: the server's answer holds no response to the request: {self.shown(text)}"
            )
        error = message.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            said = self.shown(error.get("message"))
            if isinstance(code, int) and code in accept:
                return Answer(code=code, message=said)
            if code == _INTERNAL:
                raise RetryableProviderError(f"{what}: the server had an internal error: {said}")
            raise PermanentProviderError(f"{what}: the server answered error {code}: {said}")
        return Answer(result=message.get("result"))

    def _post(
        self,
        what: str,
        envelope: Mapping[str, Any],
        values: Mapping[str, JSON],
        repeatable: bool,
        headers: Mapping[str, str],
    ) -> str:
        budget = RequestBudget(self._settings.max_request_bytes, what)
        budget.charge(len(self._url.encode()))
        content = fill_body(envelope, values, budget)
        reply = self._http.send(
            "POST",
            self._url,
            what=what,
            content=content,
            headers={**self._sent_headers(), **headers},
            accept=(404,) if self.session is not None else (),
            repeatable=repeatable,
            charged=budget,
            raw=True,
        )
        if reply.status == 404:
            raise PermanentProviderError(
                f"{what}: the server no longer has session {self.shown(self.session)} (it "
                "ended, or the server restarted); what ran in it cannot be reached"
            )
        session = _header(reply.headers, "mcp-session-id")
        if session is not None and self.session is None:
            self.session = session
        return str(reply.body or "")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def _at(document: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(document, dict):
            return None
        document = document.get(part)
    return document


def _messages(text: str) -> list[Any]:
    """The JSON-RPC messages in an answer: a JSON body, or the data of each event of an
    event stream (``text/event-stream``)."""
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "{[":
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError:
            return []
        return document if isinstance(document, list) else [document]
    found: list[Any] = []
    for event in stripped.replace("\r\n", "\n").replace("\r", "\n").split("\n\n"):
        data = [
            line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")
        ]
        if data:
            try:
                found.append(json.loads("\n".join(data)))
            except json.JSONDecodeError:
                continue
    return found


def _response(text: str, request_id: int) -> dict[str, Any] | None:
    """The response to ``request_id`` among the answer's messages (a server may send its
    own notifications or requests first)."""
    for message in _messages(text):
        if (
            isinstance(message, dict)
            and message.get("id") == request_id
            and ("result" in message or "error" in message)
        ):
            return message
    return None
