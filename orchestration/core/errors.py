"""The one error tree. A message a user sees names what was wrong and what to do."""

from __future__ import annotations


class OrchestrationError(Exception):
    """Base of every error this project raises on purpose."""

    #: A stable, machine-readable code (used by the CLI's JSON output and the HTTP API).
    code = "orchestration_error"


class ConfigurationError(OrchestrationError):
    """Settings are missing or inconsistent; raised at start-up, before any work is done."""

    code = "configuration_error"


class ValidationError(OrchestrationError):
    """Bad input. Carries the field (a dotted path) so the caller knows what to fix."""

    code = "validation_error"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class LimitExceeded(ValidationError):
    """An input or the system is over one of its configured limits."""

    code = "limit_exceeded"


class IdempotencyConflict(OrchestrationError):
    """The same (owner, request_id) was launched before with another workflow or other args."""

    code = "idempotency_conflict"

    def __init__(self, request_id: str, run_id: str) -> None:
        self.request_id = request_id
        self.run_id = run_id
        super().__init__(
            f"request_id {request_id!r} was already used for run {run_id} with a different "
            "workflow or args; use a new request_id for a different launch"
        )


class RunNotFound(OrchestrationError):
    """No run with that id for this owner (another owner's run is reported the same way)."""

    code = "not_found"

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} for this owner")


class ArtifactNotFound(OrchestrationError):
    """No artifact with that hash for this owner (another owner's is reported the same way),
    or its bytes are gone from the store."""

    code = "not_found"


class ArtifactCorrupt(OrchestrationError):
    """An artifact's stored bytes do not hash to its sha256: the store was changed outside
    the engine, and the value is not served."""

    code = "artifact_corrupt"


class IllegalTransition(OrchestrationError):
    """A status write that the state machine does not allow, or that lost a race."""

    code = "illegal_transition"

    def __init__(self, kind: str, ident: str, current: str | None, target: str) -> None:
        self.kind = kind
        self.ident = ident
        self.current = current
        self.target = target
        super().__init__(f"{kind} {ident}: cannot move from {current!r} to {target!r}")


class ConflictError(OrchestrationError):
    """The request is valid but the run's state does not allow it now (e.g. answer a run
    that is not parked for a human, or launch onto a held concurrency key with
    ``on_conflict=reject``)."""

    code = "conflict"


class DatabaseNotReady(OrchestrationError):
    """The schema is missing or behind; the fix is ``orchestration db upgrade``."""

    code = "database_not_ready"


class BrokerUnavailable(OrchestrationError):
    """The broker did not take a message (unreachable, refused, timed out). The rows written
    before are durable: a launch's run is saved, and the sweeper sends its step chain once its
    heartbeat is dead and the broker is back. ``broker`` is the broker's URL with its password
    masked; ``run_id`` names the saved run when the message was a launch's."""

    code = "broker_unavailable"

    def __init__(self, broker: str, cause: str, run_id: str | None = None) -> None:
        self.broker = broker
        self.cause = cause
        self.run_id = run_id
        message = f"the broker at {broker} is unreachable ({cause})"
        if run_id is not None:
            message += (
                f"; run {run_id} is saved and will be sent when the broker is back (the "
                "sweeper re-sends a run whose heartbeat is older than ORCH_HEARTBEAT_TIMEOUT)"
            )
        super().__init__(message)


class ProviderError(OrchestrationError):
    """A provider call failed."""

    code = "provider_error"


class RetryableProviderError(ProviderError):
    """An outage (timeout, connection refused, 5xx): the call may succeed later; the run parks
    as ``platform_interrupt`` meanwhile."""

    code = "provider_unavailable"


class PermanentProviderError(ProviderError):
    """The provider refused or lost the turn for good (bad request, vanished run): the step
    fails with this message."""

    code = "provider_rejected"


class RequestOverLimit(PermanentProviderError):
    """A request a worker would build is over ``ORCH_MAX_REQUEST_BYTES``: nothing was sent,
    and the step fails ``over_limit``."""

    code = "over_limit"


class OwnerSuspended(OrchestrationError):
    """An operator suspended the owner (``orchestration owners suspend``): no new work of it
    is admitted (launches, reruns, schedule fires, registrations, answers, approvals, API
    tokens) until an operator resumes it."""

    code = "owner_suspended"

    def __init__(self, owner: str, since: str, reason: str) -> None:
        self.owner = owner
        self.since = since
        self.reason = reason
        super().__init__(
            f"owner {owner!r} is suspended since {since} ({reason}); nothing new is admitted "
            f"for it until an operator resumes it (`orchestration owners resume {owner}`)"
        )
