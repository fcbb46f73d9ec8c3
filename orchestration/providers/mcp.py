"""The mcp provider: a step calls one tool on an MCP server over streamable HTTP.

Options (``with:``): ``url``, the server's MCP endpoint; ``tool``, the tool's name;
``arguments``, the tool's arguments as a template filled like the http provider's bodies
(``{task}``, the step's rendered task, and ``{key}``, the turn key; default ``"{task}"``: the
task itself, which must then be an object); ``headers``, literal or secret headers as the
http provider takes them (``{secret: NAME, prefix: "Bearer "}``). Every call goes through the
bounded exchange: ``ORCH_PROVIDER_HOSTS``, ``ORCH_PROVIDER_SECRETS``, the hard deadline and
the request byte budget.

``start`` opens a session (``initialize``, the protocol version negotiated) and lists the
tools. When the server runs tool calls as tasks (MCP 2025-11-25: its ``tasks.requests.tools
.call`` capability) and the tool takes them (``execution.taskSupport`` ``optional`` or
``required``), the call is task-augmented: the task and the session it is bound to are the
turn's provider run id; ``status`` is ``tasks/get`` (``tasks/result`` once completed),
``cancel`` is ``tasks/cancel``. Otherwise the call is synchronous: ``start`` makes it, within
the start's bound (at most ``ORCH_PROVIDER_TIMEOUT``), and the status read right after the
start (same process) reports its answer; a tool that takes longer fails the step, and a
status that finds no answer (the worker that called died) fails it too: a synchronous
call's answer lives nowhere else.

A task that needs input asks through MCP elicitation (the client declares ``elicitation:
{form: {}}``): its status is ``input_required``, its ``statusMessage`` the question, which the
step parks with (``status`` never reads ``tasks/result`` then: that would take the question).
The answer starts the step's next attempt, whose ``TurnRequest.asked`` is the asking turn's
run id: the resumed start opens that task's session, reads ``tasks/result`` until the
server's ``elicitation/create``, answers it (``accept``, the answer as the requested
content) and returns the asking task's run id, which ``status`` then follows to its end. A
task no longer ``input_required`` (``working``, ``completed``) was answered already: the
start returns the same id and answers nothing twice.

A redelivered start: MCP gives a requestor no name of its own for a task (the server makes
the task id and the session id, and a task keeps nothing of the request), so a second start
can find the first one's task only where it knows the first one's session. A start whose
``tools/call`` answer was lost looks in its session (``tasks/list``) before it gives up, and a
start that answered is remembered by the worker process, so a start redelivered to it
answers the same task; docs/providers.md says what is left (a worker that dies between the
server's answer and the engine's record).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from orchestration.core.egress import Resolver, system_resolver
from orchestration.core.errors import (
    LimitExceeded,
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.providers import budget, mcp_results
from orchestration.providers.base import (
    JSON,
    Evidence,
    ProviderStatus,
    TurnRef,
    TurnRequest,
    TurnStatus,
)
from orchestration.providers.exchange import exchange
from orchestration.providers.http import (
    check_known,
    check_url,
    check_url_egress,
    url_headers,
)
from orchestration.providers.mcp_wire import INVALID_PARAMS, PROTOCOL, ServerInfo, Wire
from orchestration.providers.request_budget import MAX_PLACEHOLDERS, Verbatim, count

_OPTIONS = ("url", "tool", "arguments", "headers")
_FILLED = ("task", "key")
_DEFAULT_ARGUMENTS = "{task}"
#: The task-augmented modes a tool may declare (``forbidden``, or none, means synchronous).
_TASK_MODES = ("optional", "required")
#: How many answered starts a worker process remembers (a redelivered start's lookup).
_REMEMBERED = 4096
#: How many synchronous answers it keeps for the status read right after their start.
_ANSWERS = 64
_SYNC = "call:"
#: Seconds left of a call's bound under which a call that failed for time is past its deadline.
_SPENT = 0.05


def _run_id(session: str | None, task_id: str) -> str:
    """A task turn's provider run id: the task and the session it is bound to."""
    return json.dumps({"task": task_id, "session": session}, separators=(",", ":"))


def _parsed(run_id: str) -> tuple[str | None, str]:
    """The session and the task of a task turn's run id."""
    try:
        found = json.loads(run_id)
        return found["session"], str(found["task"])
    except (ValueError, KeyError, TypeError):
        raise PermanentProviderError(f"mcp: {run_id[:80]!r} names no MCP task") from None


_NOT_WAITING = "mcp: the task that asked is no longer waiting for an answer"


def _accepted(wire: Wire, asked: Mapping[str, Any], answer: JSON) -> JSON:
    """The reply to the task's question: the answer as the content it asks for (an object
    as it is; anything else as the one property the question's schema has). An answer that
    fits no content is refused, and the question dismissed so the tool does not wait on
    it: the step fails saying what the tool asks for."""
    if isinstance(answer, Mapping):
        return {"action": "accept", "content": dict(answer)}
    schema = asked.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    names = list(properties) if isinstance(properties, Mapping) else []
    if len(names) == 1:
        return {"action": "accept", "content": {names[0]: answer}}
    raise PermanentProviderError(
        f"mcp: the tool asks for {len(names)} values ({wire.shown(', '.join(map(str, names)))}); "
        "answer with an object of them"
    )


def _keyed(request: TurnRequest) -> dict[str, str]:
    """The turn key as ``Idempotency-Key`` (as the http provider sends it), for a server or a
    gateway in front of it that honours one: MCP itself has no such key."""
    return {"Idempotency-Key": request.key}


class MCPProvider:
    """See the module docstring. ``resolver`` maps host names to addresses (tests inject
    one; the system's by default) for the launch and connect-time checks."""

    name = "mcp"

    def __init__(self, settings: Settings, resolver: Resolver = system_resolver) -> None:
        self._settings = settings
        self._resolver = resolver
        self._started: OrderedDict[str, str] = OrderedDict()
        self._answers: OrderedDict[str, TurnStatus] = OrderedDict()
        self._lock = threading.Lock()

    # --- options -------------------------------------------------------------------------

    def validate(self, options: Mapping[str, Any]) -> None:
        check_known(options, _OPTIONS)
        check_url(options.get("url"), "url")
        tool = options.get("tool")
        if not isinstance(tool, str) or not tool:
            raise ValidationError("tool", "is required: the name of the tool to call")
        arguments = options.get("arguments", _DEFAULT_ARGUMENTS)
        if not isinstance(arguments, Mapping) and arguments != _DEFAULT_ARGUMENTS:
            raise ValidationError(
                "arguments", 'must be a mapping of the tool\'s arguments, or "{task}"'
            )
        self._check_size(options, arguments)
        check_url_egress(options, self._settings, self._resolver)

    def _check_size(self, options: Mapping[str, Any], arguments: Any) -> None:
        """Refuse, at launch, arguments that name over :data:`MAX_PLACEHOLDERS` values, or
        whose ``{task}`` at its bound could take the call over ``ORCH_MAX_REQUEST_BYTES``."""
        placed = count(arguments, _FILLED, "arguments")
        if placed > MAX_PLACEHOLDERS:
            raise LimitExceeded(
                "arguments",
                f"holds over {MAX_PLACEHOLDERS} placeholders, the most one step's options may hold",
            )
        times = count(arguments, ("task",), "arguments")
        bound = self._settings.max_rendered_task_bytes
        size = len(json.dumps(dict(options), ensure_ascii=False).encode()) + times * bound
        if times and size > self._settings.max_request_bytes:
            raise LimitExceeded(
                "arguments",
                f"names {{task}} {times} times: with the task up to {bound} bytes "
                f"(ORCH_MAX_RENDERED_TASK_BYTES) its call could be {size} bytes, over the limit "
                f"of {self._settings.max_request_bytes} (ORCH_MAX_REQUEST_BYTES)",
            )

    def _headers(self, options: Mapping[str, Any]) -> dict[str, str]:
        """The step's headers, each secret checked against the URL and resolved."""
        return url_headers(options, self._settings, "mcp")

    @contextmanager
    def _wire(self, options: Mapping[str, Any], bound: float | None = None) -> Iterator[Wire]:
        headers = self._headers(options)
        with exchange(self._settings, bound=bound, resolver=self._resolver) as http:
            yield Wire(http, str(options["url"]), headers, self._settings)

    # --- the tool ------------------------------------------------------------------------

    def _tool(self, wire: Wire, name: str) -> dict[str, Any]:
        """The tool as ``tools/list`` describes it (every page until it is found)."""
        params: dict[str, Any] = {}
        while True:
            page = wire.call("tools/list", params).result
            page = page if isinstance(page, dict) else {}
            tools = [tool for tool in page.get("tools") or [] if isinstance(tool, dict)]
            for tool in tools:
                if tool.get("name") == name:
                    return tool
            cursor = page.get("nextCursor")
            if not tools or not isinstance(cursor, str) or not cursor:
                raise PermanentProviderError(
                    f"mcp: the server has no tool {wire.shown(name)!r}; check with.tool"
                )
            params = {"cursor": cursor}

    @staticmethod
    def _as_task(server: ServerInfo, tool: Mapping[str, Any]) -> bool:
        """Whether the call is task-augmented: the server runs tasks and the tool takes one."""
        execution = tool.get("execution")
        mode = execution.get("taskSupport") if isinstance(execution, dict) else None
        if mode == "required" and not server.tasks:
            raise PermanentProviderError(
                f"mcp: tool {tool.get('name')!r} requires a task, and the server (MCP "
                f"{server.protocol}) does not say it runs tool calls as tasks"
            )
        return server.tasks and mode in _TASK_MODES

    @staticmethod
    def _call_params(options: Mapping[str, Any], task: bool) -> dict[str, Any]:
        """``tools/call``'s params as a template: only the arguments are filled."""
        params: dict[str, Any] = {
            "name": Verbatim(options["tool"]),
            "arguments": options.get("arguments", _DEFAULT_ARGUMENTS),
        }
        if task:
            params["task"] = Verbatim({})
        return params

    @staticmethod
    def _values(options: Mapping[str, Any], task: JSON, key: str) -> dict[str, JSON]:
        if options.get("arguments", _DEFAULT_ARGUMENTS) == _DEFAULT_ARGUMENTS and not isinstance(
            task, Mapping
        ):
            raise PermanentProviderError(
                'mcp: with.arguments is "{task}" (the default), so the task must be an object '
                "of the tool's arguments; render one, or write with.arguments"
            )
        return {"task": task, "key": key}

    # --- the turn ------------------------------------------------------------------------

    def _start_bound(self, deadline: datetime | None) -> float | None:
        """The start's bound: the time left before ``deadline``, or nothing if it passed."""
        if deadline is None:
            return None
        left = (deadline - datetime.now(UTC)).total_seconds()
        if left <= 0:
            raise RetryableProviderError(
                f"mcp tools/call: the start's deadline passed {-left:.3f}s ago; no call began"
            )
        return min(left, self._settings.provider_timeout)

    def _remember(self, key: str, run_id: str, answer: TurnStatus | None = None) -> str:
        """Keep ``run_id`` as ``key``'s start (and a synchronous call's ``answer``), the
        oldest forgotten first."""
        with self._lock:
            self._started[key] = run_id
            self._started.move_to_end(key)
            while len(self._started) > _REMEMBERED:
                self._started.popitem(last=False)
            if answer is not None:
                self._answers[run_id] = answer
                self._answers.move_to_end(run_id)
                while len(self._answers) > _ANSWERS:
                    self._answers.popitem(last=False)
        return run_id

    def start(self, request: TurnRequest) -> str:
        with self._lock:
            known = self._started.get(request.key)
        if known is not None:
            return known
        options = request.options
        bound = budget.clamp(self._start_bound(request.deadline) or self._settings.provider_timeout)
        if request.resuming:
            return self._remember(request.key, self._answer(request, bound))
        values = self._values(options, request.input, request.key)
        with self._wire(options, bound) as wire:
            server = wire.open()
            if not self._as_task(server, self._tool(wire, str(options["tool"]))):
                return self._call_now(wire, request, bound)
            params = self._call_params(options, task=True)
            try:
                answer = wire.call(
                    "tools/call", params, values=values, repeatable=False, headers=_keyed(request)
                )
            except RetryableProviderError:
                found = self._listed(wire)
                if found is None:
                    raise
                return self._remember(request.key, _run_id(wire.session, found))
        made = answer.result.get("task") if isinstance(answer.result, dict) else None
        if not isinstance(made, dict) or not isinstance(made.get("taskId"), str):
            raise PermanentProviderError(
                "mcp tools/call: a task-augmented call answered no task: "
                + wire.shown(answer.result)
            )
        return self._remember(request.key, _run_id(wire.session, made["taskId"]))

    def _answer(self, request: TurnRequest, bound: float) -> str:
        """Give the task that asked (``request.asked``) the human's answer; its run id, which
        the resumed turn follows. A task that no longer waits (answered, or ended) is told
        nothing."""
        if request.asked is None:
            raise PermanentProviderError(
                "mcp: the answer names no MCP task that asked for it, so it cannot be given"
            )
        session, task_id = _parsed(request.asked)
        with self._wire(request.options, bound) as wire:
            wire.resume(session, PROTOCOL)
            try:
                found = wire.call("tasks/get", {"taskId": task_id}, accept=(INVALID_PARAMS,))
            except PermanentProviderError as exc:
                raise PermanentProviderError(f"{_NOT_WAITING}: {exc}") from None
            if found.code is not None:
                raise PermanentProviderError(
                    f"{_NOT_WAITING}: the server no longer has task {wire.shown(task_id)} "
                    f"({found.message})"
                )
            word = mcp_results.status_word(found.result)
            if word in ("cancelled", "failed"):
                raise PermanentProviderError(f"{_NOT_WAITING}: the task is {word}")
            if word == "input_required":
                wire.answer(task_id, lambda asked: _accepted(wire, asked, request.resume))
        return request.asked

    def _listed(self, wire: Wire) -> str | None:
        """The one task in this start's session, when its ``tools/call`` answer was lost
        after the server made it (``None`` if none, or no time is left to ask)."""
        try:
            listed = wire.call("tasks/list", {}).result
        except (RetryableProviderError, PermanentProviderError):
            return None
        tasks = listed.get("tasks") if isinstance(listed, dict) else None
        ids = [t["taskId"] for t in tasks or [] if isinstance(t, dict) and "taskId" in t]
        return str(ids[0]) if len(ids) == 1 else None

    def _run_id(self, ref: TurnRef) -> str | None:
        if ref.provider_run_id is not None:
            return ref.provider_run_id
        with self._lock:
            return self._started.get(ref.key)

    def status(self, ref: TurnRef) -> TurnStatus:
        run_id = self._run_id(ref)
        if run_id is None:
            raise PermanentProviderError(
                f"mcp: turn {ref.key!r} has no task (its start never answered); it cannot be "
                "observed"
            )
        if run_id.startswith(_SYNC):
            with self._lock:
                kept = self._answers.get(run_id)
            if kept is None:
                raise PermanentProviderError(
                    "mcp: the synchronous call's answer is gone with the worker process that "
                    "made the call (a server without tasks keeps no answer to ask again for)"
                )
            return kept
        session, task_id = _parsed(run_id)
        with self._wire(ref.options) as wire:
            wire.resume(session, PROTOCOL)
            answer = wire.call("tasks/get", {"taskId": task_id}, accept=(INVALID_PARAMS,))
            if answer.code is not None or not isinstance(answer.result, dict):
                raise PermanentProviderError(
                    f"mcp tasks/get: the server no longer has task {wire.shown(task_id)} "
                    f"({answer.message}); the turn cannot be observed"
                )
            word = mcp_results.status_word(answer.result)
            if word != "completed":
                return mcp_results.observed(answer.result)
            result = wire.call("tasks/result", {"taskId": task_id}).result
        return mcp_results.finished(result, word)

    def _call_now(self, wire: Wire, request: TurnRequest, bound: float) -> str:
        """The synchronous call of a server without tasks, within the start's ``bound``: its
        answer is kept for the status read right after, and a tool slower than the bound
        fails the turn (an outage before that is the start's, retried as any other)."""
        run_id = _SYNC + hashlib.sha256(request.key.encode()).hexdigest()[:24]
        params = self._call_params(request.options, task=False)
        values = self._values(request.options, request.input, request.key)
        try:
            result = wire.call(
                "tools/call", params, values=values, repeatable=False, headers=_keyed(request)
            ).result
        except RetryableProviderError as exc:
            if wire.remaining() > _SPENT:
                raise  # an outage before the deadline: the start's, retried as any other
            late = TurnStatus(
                ProviderStatus.FAILED,
                raw="deadline",
                error=(
                    f"the tool did not answer within {bound:g}s, the bound of one call "
                    "(ORCH_PROVIDER_TIMEOUT), and the server runs no tasks, so the call cannot "
                    f"outlast it: raise ORCH_PROVIDER_TIMEOUT, or serve the tool as a task ({exc})"
                ),
            )
            return self._remember(request.key, run_id, late)
        wire.close()
        return self._remember(request.key, run_id, mcp_results.finished(result, "call"))

    def cancel(self, ref: TurnRef) -> None:
        run_id = self._run_id(ref)
        if run_id is None or run_id.startswith(_SYNC):
            return  # nothing started, or a call that ends within its own bound
        session, task_id = _parsed(run_id)
        with self._wire(ref.options) as wire:
            wire.resume(session, PROTOCOL)
            # A task that already ended (or that the server no longer has) runs nothing.
            wire.call("tasks/cancel", {"taskId": task_id}, accept=(INVALID_PARAMS,))

    def snapshot(self, ref: TurnRef) -> JSON:
        run_id = self._run_id(ref)
        if run_id is not None and run_id.startswith(_SYNC):
            with self._lock:
                kept = self._answers.get(run_id)
            if kept is None:
                # Read in another process (a checkpoint through the outbox): the answer went
                # into the step's output when the turn ended, and is nowhere else.
                return {"status": "call", "output": None}
        observed = self.status(ref)
        return {"status": observed.raw, "output": observed.output}

    # --- the server ----------------------------------------------------------------------

    def describe(self, options: Mapping[str, Any]) -> Evidence:
        """The server's name and version (from ``initialize``), and the step's tool (which
        the server must list)."""
        with self._wire(options) as wire:
            server = wire.open()
            tool = self._tool(wire, str(options["tool"]))
            wire.close()
        execution = tool.get("execution")
        mode = execution.get("taskSupport") if isinstance(execution, dict) else None
        return Evidence(
            name=server.name,
            version=server.version,
            detail={"tool": tool["name"], "task_support": mode or "forbidden"},
        )
