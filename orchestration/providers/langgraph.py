"""The langgraph provider: turns as runs on a LangGraph Agent Server (``langgraph dev`` or a
LangSmith deployment), over its REST API.

Options (``with:``): ``url`` and ``assistant_id`` (an assistant id or a graph name) are
required; ``input`` is the run's input, where a ``"{task}"`` string is replaced by the step's
rendered task (default ``{"messages": [{"role": "user", "content": task}]}``); ``config`` is
passed to the run; ``api_key_env`` names the secret holding the API key, sent as
``x-api-key`` and never stored. The secret must be declared in ``ORCH_PROVIDER_SECRETS`` for
the host of ``url`` (a tenant's workflow could otherwise point ``url`` at its own server and
collect the key), and without ``api_key_env`` no key is sent: the old default of
``LANGGRAPH_API_KEY`` / ``LANGSMITH_API_KEY`` is gone, so name it when it is wanted.

The server has no idempotency key, so a step owns one thread, ``uuid5`` of ``run:step`` (the
turn key without its attempt), and every run carries its turn key in its metadata: ``start``
looks for that key before creating a run, and runs are created with ``multitask_strategy:
reject`` so that two racing starts cannot both run. A resume is a new run on the same thread
with ``command: {resume: value}``.

Completion is read on the run, the rest on the thread: a ``success`` run whose thread is
``interrupted`` waits for a human; an ``error`` run's text is on the thread.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from orchestration.core.egress import Resolver, system_resolver
from orchestration.core.errors import (
    LimitExceeded,
    PermanentProviderError,
    RetryableProviderError,
    ValidationError,
)
from orchestration.core.settings import Settings
from orchestration.limits import secrets
from orchestration.providers.base import (
    JSON,
    Evidence,
    ProviderStatus,
    TurnRef,
    TurnRequest,
    TurnStatus,
)
from orchestration.providers.exchange import Exchange, check_egress, exchange
from orchestration.providers.http import check_known, check_url, json_size
from orchestration.providers.request_budget import (
    MAX_PLACEHOLDERS,
    RequestBudget,
    Verbatim,
    count,
    fill_body,
)

#: Namespace of the thread ids: the same (run, step) always lands on the same thread.
THREAD_NAMESPACE = uuid.UUID("5f0c2a9e-7d41-4b8e-9a57-3c6e1d2b8f40")
#: Run metadata field that carries the turn key.
KEY_FIELD = "orchestration_turn_key"
_OPTIONS = ("url", "assistant_id", "input", "config", "api_key_env")
_RUN_PAGE = 100
_RUN_WORDS = {
    "pending": ProviderStatus.PENDING,
    "running": ProviderStatus.RUNNING,
    "interrupted": ProviderStatus.CANCELLED,
}


def thread_id(key: str) -> str:
    """The step's thread: the turn key (``run:step:attempt``) without its attempt."""
    prefix, sep, _attempt = key.rpartition(":")
    if not sep:
        raise PermanentProviderError(f"langgraph: turn key {key!r} is not run:step:attempt")
    return str(uuid.uuid5(THREAD_NAMESPACE, prefix))


def _vanished(thread: str, run: str) -> PermanentProviderError:
    return PermanentProviderError(
        f"langgraph: run {run} on thread {thread} is gone from the server (a restarted dev "
        "server loses what it had not saved yet); the turn cannot be observed"
    )


def _text(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def last_answer(values: JSON) -> JSON:
    """The last AI message's content, JSON-decoded when it parses; else the whole state."""
    messages = values.get("messages") if isinstance(values, dict) else None
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("type") in ("ai", "AIMessageChunk"):
            content = message.get("content")
            if isinstance(content, str):
                try:
                    return json.loads(content)
                except json.JSONDecodeError:
                    return content
            return content
    return values


def _prompt(thread: Mapping[str, Any]) -> JSON:
    """The interrupt value (a list when several interrupts wait)."""
    interrupts = thread.get("interrupts") or {}
    found = [
        item.get("value") if isinstance(item, dict) else item
        for items in (interrupts.values() if isinstance(interrupts, dict) else [interrupts])
        for item in (items if isinstance(items, list) else [items])
    ]
    return found[0] if len(found) == 1 else found or None


class LangGraphProvider:
    """See the module docstring. ``resolver`` maps host names to addresses (tests inject
    one; the system's by default) for the launch and connect-time checks."""

    name = "langgraph"

    def __init__(self, settings: Settings, resolver: Resolver = system_resolver) -> None:
        self._settings = settings
        self._resolver = resolver

    def validate(self, options: Mapping[str, Any]) -> None:
        check_known(options, _OPTIONS)
        check_url(options.get("url"), "url")
        assistant = options.get("assistant_id")
        if not isinstance(assistant, str) or not assistant:
            raise ValidationError("assistant_id", "is required: an assistant id or graph name")
        for name in ("input", "config"):
            if name in options and not isinstance(options[name], Mapping):
                raise ValidationError(name, "must be a mapping")
        api_key_env = options.get("api_key_env")
        if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
            raise ValidationError("api_key_env", "must name a secret")
        self._check_input(options.get("input"))
        check_egress(options["url"], "url", self._settings, self._resolver)
        if api_key_env is not None:
            secrets.check_bound(api_key_env, {"url": options["url"]}, "api_key_env", self._settings)

    def _check_input(self, template: Any) -> None:
        """At most :data:`MAX_PLACEHOLDERS` in ``input``, and not so many ``{task}`` that the
        task's bound alone would take its request over ``ORCH_MAX_REQUEST_BYTES``."""
        times = count(template, ("task",), "input")
        if times > MAX_PLACEHOLDERS:
            raise LimitExceeded(
                "input", f"holds {times} placeholders, over the limit of {MAX_PLACEHOLDERS}"
            )
        bound = self._settings.max_rendered_task_bytes
        if times * bound > self._settings.max_request_bytes:
            raise LimitExceeded(
                "input",
                f"names {{task}} {times} times: with the task up to {bound} bytes "
                f"(ORCH_MAX_RENDERED_TASK_BYTES) its request could be over the limit of "
                f"{self._settings.max_request_bytes} (ORCH_MAX_REQUEST_BYTES)",
            )

    @contextmanager
    def _session(
        self, options: Mapping[str, Any]
    ) -> Iterator[tuple[Exchange, str, dict[str, str]]]:
        url = str(options["url"])
        headers: dict[str, str] = {}
        if "api_key_env" in options:
            headers["x-api-key"] = secrets.secret_value(
                options["api_key_env"], url, self._settings, "langgraph"
            )
        with exchange(self._settings, resolver=self._resolver) as http:
            yield http, url.rstrip("/"), headers

    def _find_run(
        self, http: Exchange, base: str, headers: dict[str, str], thread: str, key: str
    ) -> str | None:
        """The run that carries ``key`` in its metadata (the thread has a run per attempt)."""
        offset = 0
        while True:
            reply = http.send(
                "GET",
                f"{base}/threads/{thread}/runs",
                what="langgraph find run",
                headers=headers,
                params={"limit": _RUN_PAGE, "offset": offset, "select": ["run_id", "metadata"]},
                accept=(404,),
            )
            runs = reply.body if reply.status == 200 and isinstance(reply.body, list) else []
            for run in runs:
                if isinstance(run, dict) and (run.get("metadata") or {}).get(KEY_FIELD) == key:
                    return str(run["run_id"])
            if len(runs) < _RUN_PAGE:
                return None
            offset += _RUN_PAGE

    def start(self, request: TurnRequest) -> str:
        options = request.options
        thread = thread_id(request.key)
        if request.key.rpartition(":")[0] != f"{request.run_id}:{request.step_id}":
            raise PermanentProviderError(
                f"langgraph: turn key {request.key!r} does not start with run:step "
                f"({request.run_id}:{request.step_id}); the step's thread would be lost"
            )
        # The input is the one part a tenant's values are filled into; the rest goes as it is.
        payload: dict[str, Any] = {
            "assistant_id": Verbatim(options["assistant_id"]),
            "metadata": Verbatim({KEY_FIELD: request.key}),
            "multitask_strategy": "reject",
        }
        if "config" in options:
            payload["config"] = Verbatim(options["config"])
        if request.resuming:
            payload["command"] = Verbatim({"resume": request.resume})
        elif "input" in options:
            payload["input"] = options["input"]
        else:
            payload["input"] = Verbatim(
                {"messages": [{"role": "user", "content": _text(request.input)}]}
            )
        # Rendered before any request: a run over its budget creates no thread either.
        url = f"{str(options['url']).rstrip('/')}/threads/{thread}/runs"
        budget = RequestBudget(self._settings.max_request_bytes, "langgraph create run")
        budget.charge(len(url.encode()))
        content = fill_body(payload, {"task": request.input}, budget)
        with self._session(options) as (http, base, headers):
            http.send(
                "POST",
                f"{base}/threads",
                what="langgraph create thread",
                headers=headers,
                json_body={
                    "thread_id": thread,
                    "if_exists": "do_nothing",
                    "metadata": {
                        "orchestration_run_id": request.run_id,
                        "orchestration_step_id": request.step_id,
                    },
                },
            )
            existing = self._find_run(http, base, headers, thread, request.key)
            if existing is not None:
                return existing
            reply = http.send(
                "POST",
                url,
                what="langgraph create run",
                headers=headers,
                content=content,
                accept=(409,),
                repeatable=False,
                charged=budget,
            )
            if reply.status == 409:
                # A racing start with the same key won, or an earlier attempt's run still holds
                # the thread (it settles shortly after a cancel).
                existing = self._find_run(http, base, headers, thread, request.key)
                if existing is not None:
                    return existing
                raise RetryableProviderError(
                    f"langgraph: thread {thread} is busy with another run; retry once it settles"
                )
        run_id = reply.body.get("run_id") if isinstance(reply.body, dict) else None
        if not isinstance(run_id, str):
            shown = secrets.redact(repr(reply.body), self._settings)[:300]
            raise PermanentProviderError(f"langgraph create run: no run_id in {shown}")
        return run_id

    def _run_id(self, http: Exchange, base: str, headers: dict[str, str], ref: TurnRef) -> str:
        if ref.provider_run_id is not None:
            return ref.provider_run_id
        found = self._find_run(http, base, headers, thread_id(ref.key), ref.key)
        if found is None:
            raise PermanentProviderError(f"langgraph: no run carries turn key {ref.key!r}")
        return found

    def _get(self, http: Exchange, url: str, headers: dict[str, str], what: str) -> JSON:
        reply = http.send("GET", url, what=what, headers=headers, accept=(404,))
        return None if reply.status == 404 else reply.body

    def status(self, ref: TurnRef) -> TurnStatus:
        thread = thread_id(ref.key)
        with self._session(ref.options) as (http, base, headers):
            run_id = self._run_id(http, base, headers, ref)
            run = self._get(
                http, f"{base}/threads/{thread}/runs/{run_id}", headers, "langgraph run"
            )
            if not isinstance(run, dict):
                raise _vanished(thread, run_id)
            word = run.get("status")
            if word in _RUN_WORDS:
                return TurnStatus(_RUN_WORDS[word], raw=word)
            if word == "timeout":
                return TurnStatus(
                    ProviderStatus.FAILED, raw=word, error="the LangGraph server timed out the run"
                )
            if word not in ("success", "error"):
                raise PermanentProviderError(
                    f"langgraph: run {run_id} has status {http.redact(repr(word))}, which this "
                    "provider does not "
                    "know (pending, running, success, error, timeout, interrupted)"
                )
            found = self._get(http, f"{base}/threads/{thread}", headers, "langgraph thread")
            if not isinstance(found, dict):
                raise _vanished(thread, run_id)
            if word == "error":
                return TurnStatus(
                    ProviderStatus.FAILED, raw=word, error=self._error(http, base, headers, found)
                )
            return self._settled(found)

    def _settled(self, thread: Mapping[str, Any]) -> TurnStatus:
        """A ``success`` run, read through its thread."""
        word = thread.get("status")
        raw = f"success/{word}"
        if word == "busy":
            return TurnStatus(ProviderStatus.RUNNING, raw=raw)
        if word == "interrupted":
            return TurnStatus(ProviderStatus.INPUT_REQUIRED, raw=raw, prompt=_prompt(thread))
        if word == "error":
            return TurnStatus(ProviderStatus.FAILED, raw=raw, error=_text(thread.get("error")))
        if word != "idle":
            raise PermanentProviderError(
                f"langgraph: thread {thread.get('thread_id')} has status "
                f"{secrets.redact(repr(word), self._settings)}, which this "
                "provider does not know (idle, busy, interrupted, error)"
            )
        # Its size is the engine's to judge (``over_limit``), like every returned value.
        return TurnStatus(
            ProviderStatus.COMPLETED, raw=raw, output=last_answer(thread.get("values"))
        )

    def _error(
        self, http: Exchange, base: str, headers: dict[str, str], thread: Mapping[str, Any]
    ) -> str:
        """The failed run's text: the thread's error, else its pending tasks' errors."""
        error = thread.get("error")
        if isinstance(error, dict) and "message" in error:
            return f"{error.get('error', 'Error')}: {error['message']}"
        if error:
            return _text(error)
        state = self._get(
            http, f"{base}/threads/{thread['thread_id']}/state", headers, "langgraph state"
        )
        tasks = state.get("tasks") if isinstance(state, dict) else None
        texts = [t["error"] for t in tasks or [] if isinstance(t, dict) and t.get("error")]
        return "; ".join(map(str, texts)) or "the run ended in error without an error text"

    def cancel(self, ref: TurnRef) -> None:
        thread = thread_id(ref.key)
        with self._session(ref.options) as (http, base, headers):
            run_id = ref.provider_run_id or self._find_run(http, base, headers, thread, ref.key)
            if run_id is None:
                return
            # 404: the run already finished (or never existed); either way nothing runs.
            http.send(
                "POST",
                f"{base}/threads/{thread}/runs/{run_id}/cancel",
                what="langgraph cancel",
                headers=headers,
                params={"action": "interrupt"},
                accept=(404,),
            )

    def snapshot(self, ref: TurnRef) -> JSON:
        thread = thread_id(ref.key)
        with self._session(ref.options) as (http, base, headers):
            state = self._get(http, f"{base}/threads/{thread}/state", headers, "langgraph state")
        if not isinstance(state, dict):
            raise _vanished(thread, ref.provider_run_id or ref.key)
        values = state.get("values")
        snapshot: dict[str, JSON] = {
            "thread_id": thread,
            "checkpoint_id": (state.get("checkpoint") or {}).get("checkpoint_id"),
            "next": state.get("next"),
            "output": last_answer(values),
            "values": values,
        }
        limit = self._settings.max_output_bytes
        for name in ("values", "output"):
            size = json_size(snapshot[name])
            if json_size(snapshot) > limit:
                snapshot[name] = {"omitted": f"{size} bytes, over ORCH_MAX_OUTPUT_BYTES"}
        return snapshot

    def describe(self, options: Mapping[str, Any]) -> Evidence:
        """The step's assistant: its name and version, with its id and graph. An
        ``assistant_id`` that is a graph name reads the graph's first assistant."""
        wanted = str(options["assistant_id"])
        with self._session(options) as (http, base, headers):
            reply = http.send(
                "GET",
                f"{base}/assistants/{quote(wanted, safe='')}",
                what="langgraph assistant",
                headers=headers,
                accept=(404, 422),
            )
            found = reply.body if reply.status == 200 else None
            if not isinstance(found, dict):
                listed = http.send(
                    "POST",
                    f"{base}/assistants/search",
                    what="langgraph assistant search",
                    headers=headers,
                    json_body={"graph_id": wanted, "limit": 1},
                    accept=(404, 422),
                ).body
                found = listed[0] if isinstance(listed, list) and listed else None
        if not isinstance(found, dict):
            shown = secrets.redact(wanted, self._settings)
            raise PermanentProviderError(
                f"langgraph: the server has no assistant or graph {shown!r}"
            )
        version = found.get("version")
        return Evidence(
            name=str(found.get("name") or found.get("graph_id") or wanted),
            version=None if version is None else str(version),
            detail={"assistant_id": found.get("assistant_id"), "graph_id": found.get("graph_id")},
        )
