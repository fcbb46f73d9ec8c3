"""The a2a provider: turns as tasks of an agent that speaks A2A 1.0 over JSON-RPC.

Options (``with:``): ``url``, the agent's JSON-RPC endpoint (its card is at
``{url}/.well-known/agent-card.json``); ``skill``, the id of the card's skill the step uses
(recorded, and checked against the card); ``headers``, literal or secret headers as the http
provider takes them (``{secret: NAME, prefix: "Bearer "}``). Every call goes through the
bounded exchange: ``ORCH_PROVIDER_HOSTS``, ``ORCH_PROVIDER_SECRETS``, the hard deadline and
the request byte budget.

A turn is one task. ``start`` sends ``SendMessage`` without waiting
(``returnImmediately``), in a context of its own, ``uuid5`` of the turn key, and with a
message id derived from the key; before sending, it lists the context's tasks
(``ListTasks``), so a redelivered start returns the task the first one made. A resume (a
human's answer) is a message on the task that asked: the task is found in the context of an
earlier attempt, and its history tells whether this turn's message is already there.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestration.core.egress import Resolver, system_resolver
from orchestration.core.errors import (
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.limits import secrets
from orchestration.providers import a2a_tasks
from orchestration.providers.base import JSON, Evidence, TurnRef, TurnRequest, TurnStatus
from orchestration.providers.exchange import Exchange, exchange
from orchestration.providers.http import (
    check_known,
    check_url,
    check_url_egress,
    json_size,
    url_headers,
)
from orchestration.providers.request_budget import RequestBudget, Verbatim, fill_body

#: Namespace of the context and message ids: the same turn key always names the same ones.
NAMESPACE = uuid.UUID("0b6f3c55-2a8e-4d4b-9f0e-5a7c1e2d9b61")
#: The protocol version this provider speaks (the ``A2A-Version`` header).
PROTOCOL = "1.0"
CARD_PATH = "/.well-known/agent-card.json"
_OPTIONS = ("url", "skill", "headers")
#: JSON-RPC error codes of A2A 1.0 that a caller acts on.
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
_UNSUPPORTED = (-32601, -32004)  # method not found, unsupported operation
_VERSION_NOT_SUPPORTED = -32009
_INTERNAL = -32603
_SNIPPET_CHARS = 300
_PAGE = 100


def context_id(key: str) -> str:
    """The context a turn's task lives in."""
    return str(uuid.uuid5(NAMESPACE, f"context:{key}"))


def message_id(key: str) -> str:
    """The id of the message a turn sends (its start, or its resume)."""
    return str(uuid.uuid5(NAMESPACE, f"message:{key}"))


def _earlier_keys(key: str) -> list[str]:
    """The turn keys of the step's earlier attempts, latest first."""
    prefix, sep, attempt = key.rpartition(":")
    if not sep or not attempt.isdigit():
        raise PermanentProviderError(f"a2a: turn key {key!r} is not run:step:attempt")
    return [f"{prefix}:{n}" for n in range(int(attempt) - 1, 0, -1)]


def _part(value: JSON) -> dict[str, JSON]:
    """The message part carrying ``value``: a text, or any other JSON as data."""
    return {"text": value} if isinstance(value, str) else {"data": value}


@dataclass(frozen=True)
class _Answer:
    """A JSON-RPC answer: its ``result``, or the error code it came with."""

    result: JSON = None
    code: int | None = None


class A2AProvider:
    """See the module docstring. ``resolver`` maps host names to addresses (tests inject
    one; the system's by default) for the launch and connect-time checks."""

    name = "a2a"

    def __init__(self, settings: Settings, resolver: Resolver = system_resolver) -> None:
        self._settings = settings
        self._resolver = resolver

    # --- options -------------------------------------------------------------------------

    def validate(self, options: Mapping[str, Any]) -> None:
        check_known(options, _OPTIONS)
        check_url(options.get("url"), "url")
        skill = options.get("skill")
        if skill is not None and (not isinstance(skill, str) or not skill):
            raise ValidationError("skill", "must be the id of a skill on the agent's card")
        check_url_egress(options, self._settings, self._resolver)

    def _headers(self, options: Mapping[str, Any]) -> dict[str, str]:
        """The headers every call sends: the protocol version, then the step's own, each
        secret checked against the URL and resolved."""
        return url_headers(options, self._settings, "a2a", {"A2A-Version": PROTOCOL})

    # --- calls ---------------------------------------------------------------------------

    @contextmanager
    def _session(
        self, options: Mapping[str, Any], bound: float | None = None
    ) -> Iterator[tuple[Exchange, str, dict[str, str]]]:
        headers = self._headers(options)
        with exchange(self._settings, bound=bound, resolver=self._resolver) as http:
            yield http, str(options["url"]), headers

    def _rpc(
        self,
        http: Exchange,
        url: str,
        headers: Mapping[str, str],
        method: str,
        params: Mapping[str, Any],
        *,
        accept: Collection[int] = (),
        repeatable: bool = True,
    ) -> _Answer:
        """One JSON-RPC call; an error whose code is in ``accept`` is returned, any other
        raises (an internal error as an outage, the rest as refusals)."""
        what = f"a2a {method}"
        budget = RequestBudget(self._settings.max_request_bytes, what)
        budget.charge(len(url.encode()))
        envelope = {"jsonrpc": "2.0", "id": 1, "method": method, "params": Verbatim(params)}
        reply = http.send(
            "POST",
            url,
            what=what,
            content=fill_body(envelope, {}, budget),
            headers=headers,
            repeatable=repeatable,
            charged=budget,
        )
        body = reply.body if isinstance(reply.body, dict) else {}
        error = body.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            if isinstance(code, int) and code in accept:
                return _Answer(code=code)
            raise self._refusal(what, code, error.get("message"))
        if "result" not in body:
            raise PermanentProviderError(
                f"{what}: the answer is not a JSON-RPC response: {self._shown(reply.body)}"
            )
        return _Answer(result=body["result"])

    def _refusal(
        self, what: str, code: Any, message: Any
    ) -> PermanentProviderError | RetryableProviderError:
        said = self._shown(message)
        if code == _VERSION_NOT_SUPPORTED:
            return PermanentProviderError(
                f"{what}: the agent does not speak A2A {PROTOCOL} ({said}); this provider "
                f"speaks A2A {PROTOCOL} over JSON-RPC"
            )
        if code == _INTERNAL:
            return RetryableProviderError(f"{what}: the agent had an internal error: {said}")
        return PermanentProviderError(f"{what}: the agent answered error {code}: {said}")

    def _shown(self, value: Any) -> str:
        """What an agent said, as an error quotes it: redacted, then cut."""
        return secrets.redact(str(value), self._settings)[:_SNIPPET_CHARS]

    def _tasks(
        self,
        http: Exchange,
        url: str,
        headers: Mapping[str, str],
        context: str,
        *,
        history: bool = False,
    ) -> list[dict[str, Any]]:
        """The tasks in ``context`` (with their history when ``history``)."""
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {"contextId": context, "pageSize": _PAGE}
        if not history:
            params["historyLength"] = 0
        while True:
            answer = self._rpc(http, url, headers, "ListTasks", params, accept=_UNSUPPORTED)
            if answer.code is not None:
                raise PermanentProviderError(
                    "a2a ListTasks: the agent does not list tasks, which this provider needs "
                    "so that a start sent twice makes one task (A2A 1.0's ListTasks, with a "
                    "contextId filter)"
                )
            page = answer.result if isinstance(answer.result, dict) else {}
            tasks = page.get("tasks")
            found += [task for task in tasks or [] if isinstance(task, dict) and "id" in task]
            token = page.get("nextPageToken")
            if not tasks or not isinstance(token, str) or not token:
                return found
            params["pageToken"] = token

    def _carrying(
        self, http: Exchange, url: str, headers: Mapping[str, str], key: str
    ) -> dict[str, Any] | None:
        """The task that carries ``key``: the one in its context, or (a resume) the earlier
        attempt's task whose history holds its message."""
        own = self._tasks(http, url, headers, context_id(key))
        if own:
            return own[0]
        sent = message_id(key)
        for earlier in _earlier_keys(key):
            for task in self._tasks(http, url, headers, context_id(earlier), history=True):
                if any(
                    isinstance(m, dict) and m.get("messageId") == sent
                    for m in task.get("history") or []
                ):
                    return task
        return None

    def _asking(
        self, http: Exchange, url: str, headers: Mapping[str, str], key: str
    ) -> dict[str, Any]:
        """The task a resume answers: the latest earlier attempt's task."""
        for earlier in _earlier_keys(key):
            tasks = self._tasks(http, url, headers, context_id(earlier), history=True)
            if tasks:
                return tasks[0]
        raise PermanentProviderError(
            f"a2a: no earlier attempt of turn {key!r} has a task to send the answer to"
        )

    # --- the turn ------------------------------------------------------------------------

    def _start_bound(self, deadline: datetime | None) -> float | None:
        """The start's bound: the time left before ``deadline``, or nothing if it passed."""
        if deadline is None:
            return None
        left = (deadline - datetime.now(UTC)).total_seconds()
        if left <= 0:
            raise RetryableProviderError(
                f"a2a SendMessage: the start's deadline passed {-left:.3f}s ago; no task began"
            )
        return min(left, self._settings.provider_timeout)

    def start(self, request: TurnRequest) -> str:
        bound = self._start_bound(request.deadline)
        key = request.key
        value = request.resume if request.resuming else request.input
        message: dict[str, Any] = {
            "messageId": message_id(key),
            "role": "ROLE_USER",
            "parts": [_part(value)],
        }
        with self._session(request.options, bound) as (http, url, headers):
            if request.resuming:
                task = self._asking(http, url, headers, key)
                history = [m for m in task.get("history") or [] if isinstance(m, dict)]
                if any(m.get("messageId") == message["messageId"] for m in history):
                    return str(task["id"])
                if not history and a2a_tasks.state(task) != "TASK_STATE_INPUT_REQUIRED":
                    return str(task["id"])  # no history kept: the state says it was answered
                message.update(taskId=task["id"], contextId=task.get("contextId"))
            else:
                found = self._tasks(http, url, headers, context_id(key))
                if found:
                    return str(found[0]["id"])
                message["contextId"] = context_id(key)
            if request.deadline is not None:
                headers["Request-Deadline"] = request.deadline.isoformat(timespec="milliseconds")
            params = {"message": message, "configuration": {"returnImmediately": True}}
            answer = self._rpc(http, url, headers, "SendMessage", params, repeatable=False).result
        made = answer.get("task") if isinstance(answer, dict) else None
        if isinstance(made, dict) and isinstance(made.get("id"), str):
            return str(made["id"])
        if isinstance(answer, dict) and "message" in answer:
            raise PermanentProviderError(
                "a2a SendMessage: the agent answered with a message, not a task; this provider "
                "drives tasks (an agent that only answers messages cannot be a step)"
            )
        raise PermanentProviderError(f"a2a SendMessage: no task in {self._shown(answer)}")

    def _task(self, ref: TurnRef) -> dict[str, Any]:
        """The turn's task, as ``GetTask`` says it is now."""
        with self._session(ref.options) as (http, url, headers):
            task_id = ref.provider_run_id
            if task_id is None:
                found = self._carrying(http, url, headers, ref.key)
                if found is None:
                    raise PermanentProviderError(f"a2a: no task carries turn key {ref.key!r}")
                task_id = str(found["id"])
            params = {"id": task_id, "historyLength": 0}
            answer = self._rpc(http, url, headers, "GetTask", params, accept=(TASK_NOT_FOUND,))
        if answer.code == TASK_NOT_FOUND or not isinstance(answer.result, dict):
            raise PermanentProviderError(
                f"a2a: task {task_id} is gone from the agent; the turn cannot be observed"
            )
        return answer.result

    def status(self, ref: TurnRef) -> TurnStatus:
        return a2a_tasks.observed(self._task(ref))

    def cancel(self, ref: TurnRef) -> None:
        with self._session(ref.options) as (http, url, headers):
            task_id = ref.provider_run_id
            if task_id is None:
                found = self._carrying(http, url, headers, ref.key)
                if found is None:
                    return  # nothing started
                task_id = str(found["id"])
            # A task that already ended (or that the agent no longer has) runs nothing.
            self._rpc(
                http,
                url,
                headers,
                "CancelTask",
                {"id": task_id},
                accept=(TASK_NOT_FOUND, TASK_NOT_CANCELABLE),
            )

    def snapshot(self, ref: TurnRef) -> JSON:
        task = self._task(ref)
        snapshot: dict[str, JSON] = {
            "task_id": task.get("id"),
            "context_id": task.get("contextId"),
            "state": a2a_tasks.state(task),
            "output": a2a_tasks.output(task),
        }
        if json_size(snapshot) > self._settings.max_output_bytes:
            size = json_size(snapshot["output"])
            snapshot["output"] = {"omitted": f"{size} bytes, over ORCH_MAX_OUTPUT_BYTES"}
        return snapshot

    # --- the agent card ------------------------------------------------------------------

    def describe(self, options: Mapping[str, Any]) -> Evidence:
        """The agent card's name and version, and the step's skill (which the card must
        list)."""
        with self._session(options) as (http, url, headers):
            card_url = url.rstrip("/") + CARD_PATH
            reply = http.send("GET", card_url, what="a2a agent card", headers=headers)
        card = reply.body if isinstance(reply.body, dict) else None
        if card is None or not isinstance(card.get("name"), str):
            raise PermanentProviderError(
                f"a2a agent card: {card_url} answered no agent card: {self._shown(reply.body)}"
            )
        version = card.get("version")
        detail: dict[str, JSON] = {}
        skill = options.get("skill")
        if skill is not None:
            skills = [s for s in card.get("skills") or [] if isinstance(s, dict)]
            if not any(s.get("id") == skill for s in skills):
                listed = ", ".join(str(s.get("id")) for s in skills) or "none"
                raise PermanentProviderError(
                    f"a2a agent card: {card['name']!r} lists no skill {self._shown(skill)!r} "
                    f"(its skills: {self._shown(listed)})"
                )
            detail["skill"] = skill
        return Evidence(
            name=self._shown(card["name"]),
            version=self._shown(version) if isinstance(version, str) else None,
            detail=detail,
        )
