"""Every bound and URL in one settings object, read from ``ORCH_*`` environment variables.

Bounds are checked for consistency when the settings are loaded, so a worker never starts with
a heartbeat timeout that a live step could outlast between two stamps.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from orchestration.errors import ConfigurationError

#: Slack added to bounds that depend on two clocks and a queue (seconds).
MARGIN_SECONDS = 2.0


class Settings(BaseSettings):
    """Configuration; each field is the environment variable ``ORCH_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="ORCH_", extra="ignore", frozen=True)

    #: SQLAlchemy URL of the database; SQLite by default, PostgreSQL in production.
    database_url: str = "sqlite:///orchestration.db"
    #: Celery broker URL (Redis, or RabbitMQ via ``amqp://``).
    broker_url: str = "redis://127.0.0.1:6379/0"
    #: Owner used by the CLI when ``--owner`` is not given.
    owner: str = "default"
    #: Celery queue for the step, effect and sweep tasks.
    queue: str = "orchestration"

    #: A live run whose heartbeat is older than this is stalled (seconds).
    heartbeat_timeout: float = Field(60.0, gt=0)
    #: Beat interval of the sweeper (seconds).
    sweep_interval: float = Field(15.0, gt=0)
    #: How long a graceful cancel may take before the sweeper enforces it (seconds).
    cancel_grace: float = Field(30.0, ge=0)
    #: Re-arms of a dead heartbeat before the run is closed ``interrupted``.
    max_rearms: int = Field(3, ge=0)
    #: Park budgets by reason (seconds).
    park_budget_human: float = Field(86400.0, gt=0)
    park_budget_engine_limit: float = Field(3600.0, gt=0)
    park_budget_platform_interrupt: float = Field(900.0, gt=0)
    park_budget_default: float = Field(3600.0, gt=0)

    #: Post-step effects: attempts, first backoff (doubling), and what exhaustion does.
    effect_attempts: int = Field(5, ge=1, le=50)
    effect_backoff: float = Field(1.0, gt=0)
    effect_policy: Literal["fail", "continue"] = "fail"
    #: Optional URL that receives a JSON POST after each finished step.
    webhook_url: str | None = None
    #: Bound on one webhook request (seconds).
    webhook_timeout: float = Field(5.0, gt=0)

    #: Bound on one provider request (seconds); a step execution lasts at most about this.
    provider_timeout: float = Field(10.0, gt=0)
    #: Largest ``max_poll_interval`` a workflow may ask for (seconds).
    max_poll_interval_limit: float = Field(30.0, gt=0)
    #: Largest step ``timeout`` a workflow may ask for (seconds).
    max_step_timeout: float = Field(86400.0, gt=0)

    #: Limits on what callers may launch.
    max_active_runs: int = Field(10000, ge=1)
    max_active_runs_per_owner: int = Field(1000, ge=1)
    max_steps: int = Field(100, ge=1)
    max_args_bytes: int = Field(65536, ge=2)
    max_task_bytes: int = Field(65536, ge=2)
    max_output_bytes: int = Field(1048576, ge=2)

    #: Redis visibility timeout: above any countdown plus a step's runtime (seconds).
    visibility_timeout: float = Field(3600.0, gt=0)
    #: How ``cancel`` kills an executing step task (prefork): SIGKILL cannot be caught.
    revoke_signal: str = "SIGKILL"

    #: Optional Celery message signing (all three or none): the private key file, its
    #: certificate file, and the folder of trusted certificates. Needs ``cryptography``.
    security_key: str | None = None
    security_certificate: str | None = None
    security_cert_store: str | None = None

    #: Storage of the scripted provider's turns; defaults beside the database (see
    #: :func:`orchestration.providers.scripted.store_url`).
    scripted_url: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _postgres_guard(cls, data: Any) -> Any:
        """On PostgreSQL, let the server abort a transaction left idle longer than
        :func:`lock_release_seconds` (a worker frozen mid-transaction would otherwise hold its
        run's row until it wakes). A URL that sets its own ``options`` is left alone."""
        if not isinstance(data, dict) or "database_url" not in data:
            return data
        url = make_url(str(data["database_url"]))
        if not url.drivername.startswith("postgres") or "options" in url.query:
            return data
        provider = data.get("provider_timeout", cls.model_fields["provider_timeout"].default)
        seconds = lock_release_seconds(float(provider))
        guarded = url.update_query_dict(
            {"options": f"-c idle_in_transaction_session_timeout={int(seconds * 1000)}"}
        )
        return {**data, "database_url": guarded.render_as_string(hide_password=False)}

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        # One execution of a step task lasts at most one provider call or one webhook call.
        call = max(self.provider_timeout, self.webhook_timeout if self.webhook_url else 0.0)
        live_gap = self.max_poll_interval_limit + call + MARGIN_SECONDS
        if self.heartbeat_timeout <= live_gap:
            raise ValueError(
                f"ORCH_HEARTBEAT_TIMEOUT ({self.heartbeat_timeout}s) must exceed "
                "ORCH_MAX_POLL_INTERVAL_LIMIT + max(ORCH_PROVIDER_TIMEOUT, ORCH_WEBHOOK_TIMEOUT "
                "when ORCH_WEBHOOK_URL is set) "
                f"+ {MARGIN_SECONDS}s ({live_gap}s): a live step stamps its heartbeat at least "
                "that often"
            )
        signing = [self.security_key, self.security_certificate, self.security_cert_store]
        if any(signing) and not all(signing):
            raise ValueError(
                "message signing needs all of ORCH_SECURITY_KEY, ORCH_SECURITY_CERTIFICATE "
                "and ORCH_SECURITY_CERT_STORE"
            )
        if self.visibility_timeout <= 2 * self.heartbeat_timeout:
            raise ValueError(
                f"ORCH_VISIBILITY_TIMEOUT ({self.visibility_timeout}s) must exceed twice "
                f"ORCH_HEARTBEAT_TIMEOUT ({self.heartbeat_timeout}s), so Redis never "
                "redelivers a countdown message that is still waiting"
            )
        return self

    def park_budget(self, reason: str | None) -> float:
        """The budget in seconds for a park reason (the fallback for an unknown one)."""
        return {
            "human": self.park_budget_human,
            "engine_limit": self.park_budget_engine_limit,
            "platform_interrupt": self.park_budget_platform_interrupt,
        }.get(reason or "", self.park_budget_default)


def lock_release_seconds(provider_timeout: float) -> float:
    """The longest a frozen writer holds a run's row on PostgreSQL before the server aborts its
    transaction. A step legitimately idles in a transaction for one provider start call (it
    holds the run row so that a cancel cannot slip in), so the bound is that call plus margin.
    """
    return provider_timeout + MARGIN_SECONDS


def load_settings() -> Settings:
    """Read settings from the environment; an error names the ``ORCH_`` variable."""
    try:
        return Settings()
    except PydanticValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["loc"]:
                message = f"ORCH_{str(error['loc'][0]).upper()}: {message}"
            problems.append(message)
        raise ConfigurationError("invalid settings: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once)."""
    return load_settings()
