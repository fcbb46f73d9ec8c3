"""MCP's streamable HTTP transport, one bounded exchange at a time: JSON-RPC requests POSTed to
the server's endpoint, answered with JSON or with an event stream whose ``message`` events carry
the response, inside a session the server names in ``Mcp-Session-Id``.

A :class:`Wire` speaks for one provider call: it opens a session (``initialize``, then
``notifications/initialized``) or resumes the session a turn's task lives in (tasks are bound
to the session that made them), and sends every request through the caller's
:class:`~orchestration.providers.exchange.Exchange`, so the egress rules, the secret binding,
the byte budget and the call's hard deadline hold for each.

An event stream is read as it arrives (:class:`_Events`): a server may ask the client
something (a request of its own, such as ``elicitation/create``) on the stream of the request
it is answering, and waits for the answer before it goes on. The client declares form
elicitation (an MCP task that needs input asks through it; ``tasks/result`` delivers the
question, :meth:`Wire.answer` answers it), so a request met inside any other call is
declined at once rather than left to hang the call until its deadline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

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
#: What the client says it can do: answer a form elicitation (a task's question).
CAPABILITIES: dict[str, Any] = {"elicitation": {"form": {}}}
ELICIT = "elicitation/create"
#: An elicitation that no person is there to answer (one met outside a resume).
DECLINED = {"action": "decline"}
#: A question whose answer could not be given: dismissed, so the tool does not wait on it.
DISMISSED = {"action": "cancel"}
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
        params = {"protocolVersion": PROTOCOL, "capabilities": CAPABILITIES, "clientInfo": CLIENT}
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
        answered: list[dict[str, Any]] = []

        def seen(message: Any) -> bool:
            if _answers(message, request_id):
                answered.append(message)
                return True
            if _asks(message):
                self.reply(message, DECLINED if message["method"] == ELICIT else None)
            return False

        text = self._post(what, envelope, values or {}, repeatable, headers or {}, seen)
        message = answered[0] if answered else _response(text, request_id)
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

    def answer(self, task_id: str, reply: Callable[[Mapping[str, Any]], JSON]) -> None:
        """Answer the question task ``task_id`` waits on: ``tasks/result`` (which delivers
        it, once) read until the server's ``elicitation/create``, whose answer,
        ``reply(params)``, is POSTed while the stream is open; the stream is then closed (a
        later ``tasks/result`` reads the task's result). A ``reply`` that raises
        ``PermanentProviderError`` dismisses the question first, so the tool does not wait
        on it. A stream that ends with the task's result had no question waiting; one that
        brings neither ends at the deadline (``RetryableProviderError``)."""
        what = "mcp tasks/result"
        self._next_id += 1
        request_id = self._next_id
        params = Verbatim({"taskId": task_id})
        envelope = {"jsonrpc": "2.0", "id": request_id, "method": "tasks/result", "params": params}
        asked: list[Mapping[str, Any]] = []

        def seen(message: Any) -> bool:
            if _answers(message, request_id):
                return True
            if not _asks(message):
                return False
            if message["method"] != ELICIT:
                self.reply(message, None)
                return False
            asked.append(message)
            question = message.get("params")
            try:
                result = reply(question if isinstance(question, dict) else {})
            except PermanentProviderError:
                self.reply(message, DISMISSED)
                raise
            self.reply(message, result)
            return True

        text = self._post(what, envelope, {}, True, {}, seen)
        found = None if asked else _response(text, request_id)
        error = found.get("error") if found is not None else None
        if not asked and (found is None or isinstance(error, dict)):
            said = self.shown(error.get("message") if isinstance(error, dict) else text)
            raise PermanentProviderError(
                f"{what}: the server sent neither the task's question nor its result: {said}"
            )

    def reply(self, request: Mapping[str, Any], result: JSON) -> None:
        """Answer a request the server sent: ``result``, or (``None``) the error that the
        client does not serve that method."""
        envelope: dict[str, Any] = {"jsonrpc": "2.0", "id": request.get("id")}
        if result is None:
            method = self.shown(request.get("method"))
            envelope["error"] = {"code": METHOD_NOT_FOUND, "message": f"not served: {method}"}
        else:
            envelope["result"] = Verbatim(result)
        self._post(f"mcp answer to {self.shown(request.get('method'))}", envelope, {}, False, {})

    def _post(
        self,
        what: str,
        envelope: Mapping[str, Any],
        values: Mapping[str, JSON],
        repeatable: bool,
        headers: Mapping[str, str],
        seen: Callable[[Any], bool] | None = None,
    ) -> str:
        """POST ``envelope``; the answer's text. ``seen`` gets each message of an event
        stream as it arrives, and ends the read by returning ``True``."""
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
            until=None if seen is None else _Events(seen).feed,
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

    def keep(message: Any) -> bool:
        found.append(message)
        return False

    # The whole stream read at once by the reader of a stream as it arrives, its last event
    # ended by the blank line a server may leave out.
    _Events(keep).feed(stripped.encode() + b"\n\n")
    return found


def _answers(message: Any, request_id: int) -> TypeGuard[dict[str, Any]]:
    """Whether ``message`` is the response to ``request_id``."""
    return (
        isinstance(message, dict)
        and message.get("id") == request_id
        and ("result" in message or "error" in message)
    )


def _asks(message: Any) -> bool:
    """Whether ``message`` is a request of the server's (which waits for an answer)."""
    return isinstance(message, dict) and "id" in message and isinstance(message.get("method"), str)


#: A line's end in an event stream: CRLF, LF or CR.
_LINE_END = re.compile(rb"\r\n|\r|\n")


class _Events:
    """The JSON-RPC messages of an event stream as its chunks arrive, each handed to ``seen``
    (``True``: read no further). Only the line being received is kept, so the work is linear
    in what arrives; a JSON body, which has no ``data:`` lines, yields nothing here."""

    def __init__(self, seen: Callable[[Any], bool]) -> None:
        self._seen = seen
        self._line: list[bytes] = []
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> bool:
        self._line.append(chunk)
        if b"\n" not in chunk and b"\r" not in chunk:
            return False
        text = b"".join(self._line)
        # A CR last may be the first half of a CRLF: keep it for the next chunk.
        cut = len(text) - 1 if text.endswith(b"\r") else len(text)
        lines = _LINE_END.split(text[:cut])
        self._line = [lines.pop() + text[cut:]]
        for line in lines:
            if line.startswith(b"data:"):
                self._data.append(line[5:].removeprefix(b" "))
            elif not line and self._data and self._dispatch():
                return True
        return False

    def _dispatch(self) -> bool:
        data, self._data = b"\n".join(self._data), []
        try:
            message = json.loads(data)
        except ValueError:
            return False
        return self._seen(message)


def _response(text: str, request_id: int) -> dict[str, Any] | None:
    """The response to ``request_id`` among the answer's messages (a server may send its
    own notifications or requests first)."""
    for message in _messages(text):
        if _answers(message, request_id):
            return message
    return None
