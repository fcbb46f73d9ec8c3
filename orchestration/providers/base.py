"""The provider interface: what the engine needs from an agent runtime.

A provider adapts one runtime (the scripted simulator, a LangGraph Agent Server, an HTTP agent
service) to three calls on a *turn*: ``start``, ``status`` and ``cancel``, plus ``snapshot`` for
the checkpoint effect. Providers hold no state rules: they report what the runtime says, in
the typed :class:`ProviderStatus`, and the engine decides what it means for the run.

Contract every provider keeps (the engine's invariants rest on it):

* ``start`` is idempotent per ``TurnRequest.key`` (``run:step:attempt``): a second call with
  the same key returns the same provider run id and never starts a second turn.
* ``cancel`` is idempotent and bounded in time; cancelling a finished turn is not an error.
* ``start`` begins no turn after ``TurnRequest.deadline`` (on the runtime's clock), where the
  runtime can tell when a request arrived: the engine's own bound ends its wait, not the
  request's flight, and a start delayed in the network past the claim window could otherwise
  land after a ``cancel`` returned. A refused late start raises
  :class:`~orchestration.core.errors.RetryableProviderError`; the engine claims the start again.
* Every call is bounded by the provider's request timeout. An outage raises
  :class:`~orchestration.core.errors.RetryableProviderError`; a refusal or a vanished turn raises
  :class:`~orchestration.core.errors.PermanentProviderError`.
* ``validate`` checks the step's ``with:`` options at launch, raising
  :class:`~orchestration.core.errors.ValidationError` naming the field, so a misconfigured provider
  fails the launch and not the first poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

#: A JSON value as the engine stores it.
JSON = Any


class ProviderStatus(StrEnum):
    """A turn's status in the engine's words."""

    #: Accepted, not running yet.
    PENDING = "pending"
    #: Working.
    RUNNING = "running"
    #: Settled with nothing left to do: a finished turn (many runtimes never say "completed").
    IDLE = "idle"
    #: Finished with an answer.
    COMPLETED = "completed"
    #: Ended with an error.
    FAILED = "failed"
    #: Waiting for a human answer; the run parks as ``human``.
    INPUT_REQUIRED = "input_required"
    #: Held by a rate limit until ``reset_at``; the run parks as ``engine_limit``.
    RATE_LIMITED = "rate_limited"
    #: Stopped by a cancel.
    CANCELLED = "cancelled"


#: Statuses that mean the turn finished successfully.
FINISHED: frozenset[ProviderStatus] = frozenset({ProviderStatus.IDLE, ProviderStatus.COMPLETED})
#: Statuses that mean the turn ended without an answer.
STOPPED: frozenset[ProviderStatus] = frozenset({ProviderStatus.FAILED, ProviderStatus.CANCELLED})
#: Statuses of a turn that has ended, one way or the other: nothing is left to stop.
ENDED: frozenset[ProviderStatus] = FINISHED | STOPPED


@dataclass(frozen=True)
class TurnRequest:
    """What ``start`` gets: the idempotency key, the rendered input and the step's options."""

    key: str
    run_id: str
    step_id: str
    attempt: int
    input: JSON
    options: Mapping[str, Any]
    #: The human's answer when this turn resumes a ``human`` park; ``None`` otherwise.
    resume: JSON = None
    #: ``True`` when this turn resumes a park (``resume`` may legitimately be ``None``).
    resuming: bool = False
    #: When resuming: the provider run id of the turn that asked (a runtime that makes its
    #: own ids, such as MCP's tasks, answers that turn); ``None`` otherwise.
    asked: str | None = None
    #: The latest moment (UTC) the turn may begin: the claim's time plus one call's bound,
    #: inside the window ``cancel`` waits for the claim. ``None``: no deadline.
    deadline: datetime | None = None


@dataclass(frozen=True)
class TurnRef:
    """How later calls name a turn: the key always, the provider's run id once known."""

    key: str
    provider_run_id: str | None
    options: Mapping[str, Any]


@dataclass(frozen=True)
class TurnStatus:
    """One observation of a turn."""

    status: ProviderStatus
    #: The provider's own word for it, kept in the step's ``last_provider_status``.
    raw: str
    output: JSON = None
    error: str | None = None
    #: For ``rate_limited``: when the limit resets.
    reset_at: datetime | None = None
    #: For ``input_required``: what the provider asks the human.
    prompt: JSON = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    """What a step's turn runs on, as the agent (or server) describes itself: what a run
    shows per step, and what pinning compares (``version``)."""

    #: The agent's or server's own name.
    name: str | None
    #: Its version as it states it; ``None`` when it states none (nothing to pin then).
    version: str | None
    #: What else identifies it: an A2A skill, an MCP tool, a LangGraph assistant id.
    detail: Mapping[str, JSON] = field(default_factory=dict)


@runtime_checkable
class Describes(Protocol):
    """A provider that can say what a step would run on now (a bounded call, through the
    egress rules like every other)."""

    def describe(self, options: Mapping[str, Any]) -> Evidence:
        """The agent's evidence for a step with these ``with:`` options."""


@runtime_checkable
class Provider(Protocol):
    """An agent runtime adapter. See the module docstring for the contract."""

    name: str

    def validate(self, options: Mapping[str, Any]) -> None:
        """Raise ``ValidationError`` (field relative to ``with``) for bad options."""

    def start(self, request: TurnRequest) -> str:
        """Start the turn once per ``request.key``; return the provider's run id."""

    def status(self, ref: TurnRef) -> TurnStatus:
        """Observe the turn."""

    def cancel(self, ref: TurnRef) -> None:
        """Ask the runtime to stop the turn; idempotent; bounded in time."""

    def snapshot(self, ref: TurnRef) -> JSON:
        """Capture the turn's state for the checkpoint effect (its output at least)."""
