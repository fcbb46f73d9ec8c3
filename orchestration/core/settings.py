"""Every bound and URL in one settings object, read from ``ORCH_*`` environment variables.

Bounds are checked for consistency when the settings are loaded, so a worker never starts with
a heartbeat timeout that a live step could outlast between two stamps.
"""

from __future__ import annotations

import math
import os
import re
import signal
from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from orchestration.core.egress import AllowList
from orchestration.core.errors import ConfigurationError
from orchestration.core.secret_declarations import declared, decode_declared
from orchestration.core.url_checks import check_broker_url, check_database_url, check_web_url

#: Slack added to bounds that depend on two clocks and a queue (seconds).
MARGIN_SECONDS = 2.0
#: The longest duration a setting may hold (ten years): every deadline computed from one
#: must stay a valid date, and ``timedelta`` overflows long before a float does.
MAX_SECONDS = 10 * 365.25 * 86400
#: The databases the engine's SQL is written and tested for.
#: Queue names that RabbitMQ, Redis and SQS all accept; ``amq.`` is reserved by RabbitMQ.
QUEUE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
#: The upkeep queue's name when ``ORCH_UPKEEP_QUEUE`` is unset: ``ORCH_QUEUE`` and this.
UPKEEP_SUFFIX = ".upkeep"
#: Owners, like request ids and concurrency keys: 1-200 printable ASCII characters.
OWNER_PATTERN = re.compile(r"[\x21-\x7e]{1,200}")
#: Signals whose default action does not end a process: a revoke with one would not stop
#: the task (``SIGSTOP`` would freeze the child for good).
NON_TERMINATING_SIGNALS = frozenset(
    {"SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGWINCH"}
)


class TenantLimits(BaseSettings):
    """Sizes and counts; each field is the environment variable ``ORCH_<FIELD>``."""

    # ``nan`` and ``inf`` parse as floats but pass or break every bound; refuse them.
    model_config = SettingsConfigDict(
        env_prefix="ORCH_", extra="ignore", frozen=True, allow_inf_nan=False
    )

    #: Limits on what callers may launch.
    max_active_runs: int = Field(10000, ge=1)
    max_active_runs_per_owner: int = Field(1000, ge=1)
    max_steps: int = Field(100, ge=1)
    max_args_bytes: int = Field(65536, ge=2)
    max_task_bytes: int = Field(65536, ge=2)
    #: Largest output a step may record (an artifact past the inline bound), and all the
    #: artifact bytes of one run's step outputs together.
    max_output_bytes: int = Field(16777216, ge=2)
    max_run_output_bytes: int = Field(268435456, ge=2)
    #: Outputs up to this size stay in the step's row; larger ones become artifacts.
    inline_output_bytes: int = Field(65536, ge=2)
    #: A folder every worker and the API share for the artifacts' bytes (the database keeps
    #: them when unset).
    artifact_dir: str | None = None
    #: Bounds on what a tenant's template renders to and a provider returns.
    max_rendered_task_bytes: int = Field(262144, ge=2)
    max_provider_id_chars: int = Field(200, ge=8, le=200)
    max_error_chars: int = Field(2000, ge=80, le=100000)
    max_prompt_bytes: int = Field(65536, ge=2)
    #: Bytes one request a worker builds may take (URL, headers and body together), for
    #: every provider call and the webhook; charged while the request is rendered.
    max_request_bytes: int = Field(1048576, ge=4096)
    #: Bytes of one step's ``with:`` options as JSON, checked at launch.
    max_options_bytes: int = Field(65536, ge=256)
    #: Per-owner budgets (issue 30), checked at admission; an operator may set an owner's own
    #: values (``orchestration owners set``). Live provider turns (a step's started turn not
    #: yet ended), registered definition versions, and bytes of stored outputs (artifacts).
    max_live_turns_per_owner: int = Field(200, ge=1)
    max_definitions_per_owner: int = Field(1000, ge=1)
    max_stored_bytes_per_owner: int = Field(10737418240, ge=1)
    #: The longest a step waits for one of its owner's live turns to end before its run fails.
    max_live_turn_wait: float = Field(3600.0, gt=0)
    #: Owners ``/metrics`` and the fleet page show against their budgets: the ones with the
    #: most live runs (0: none; owner names then never appear on ``/metrics``).
    metrics_top_owners: int = Field(10, ge=0, le=1000)

    @field_validator("artifact_dir")
    @classmethod
    def _artifact_dir(cls, value: str | None) -> str | None:
        """Empty is unset (``export ORCH_ARTIFACT_DIR=``); a path must be absolute, since
        workers and the API resolve it from different working directories."""
        if value and (not os.path.isabs(value) or "\x00" in value):
            raise ValueError(f"must be an absolute path (a folder all workers share): {value!r}")
        return value or None

    @model_validator(mode="after")
    def _sizes_fit(self) -> TenantLimits:
        """One output fits its run's outputs, and a start that sends its task once fits a
        request."""
        if self.max_output_bytes > self.max_run_output_bytes:
            raise ValueError(
                f"ORCH_MAX_OUTPUT_BYTES ({self.max_output_bytes}) must be at most "
                f"ORCH_MAX_RUN_OUTPUT_BYTES ({self.max_run_output_bytes}): one output is at "
                "most all of its run's"
            )
        fits = self.max_rendered_task_bytes + self.max_options_bytes
        if self.max_request_bytes < fits:
            raise ValueError(
                f"ORCH_MAX_REQUEST_BYTES ({self.max_request_bytes}) must be at least "
                "ORCH_MAX_RENDERED_TASK_BYTES + ORCH_MAX_OPTIONS_BYTES "
                f"({fits}): a start that sends its task once must fit"
            )
        return self


class Settings(TenantLimits):
    """Configuration; each field is the environment variable ``ORCH_<FIELD>`` (the bounds on
    what a tenant launches and stores are in :class:`TenantLimits`)."""

    # ``nan`` and ``inf`` parse as floats but pass or break every bound; refuse them.
    model_config = SettingsConfigDict(
        env_prefix="ORCH_", extra="ignore", frozen=True, allow_inf_nan=False
    )

    #: SQLAlchemy URL of the database; SQLite by default, PostgreSQL in production.
    database_url: str = "sqlite:///orchestration.db"
    #: Celery broker URL (Redis, or RabbitMQ via ``amqp://``).
    broker_url: str = "redis://127.0.0.1:6379/0"
    #: Owner used by the CLI when ``--owner`` is not given.
    owner: str = "default"
    #: Celery queue for the step and stop tasks.
    queue: str = "orchestration"
    #: Celery queue for what beat sends (sweeper, schedules, retention): ``<queue>.upkeep``
    #: when unset, so that no backlog of steps delays a sweeper pass (chaos finding 12).
    upkeep_queue: str = ""

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
    #: How long a ``for_each`` or ``parallel`` step may wait for its branches (seconds): past
    #: it the run times out and every branch is cancelled.
    park_budget_branches: float = Field(86400.0, gt=0)

    #: Post-step effects: attempts, first backoff (doubling), and what exhaustion does.
    effect_attempts: int = Field(5, ge=1, le=50)
    effect_backoff: float = Field(1.0, gt=0)
    effect_policy: Literal["fail", "continue"] = "fail"
    #: Optional URL that receives a JSON POST after each finished step.
    webhook_url: str | None = None
    #: Bound on one webhook request (seconds).
    webhook_timeout: float = Field(5.0, gt=0)

    #: Hard wall-clock bound on one provider call, DNS to last byte (seconds); a step
    #: execution lasts at most about this.
    provider_timeout: float = Field(10.0, gt=0)
    #: Bound on the provider cancel that ``cancel`` makes before it returns (seconds); a turn
    #: whose cancel did not finish in time is stopped by the ``stop_turn`` task afterwards.
    cancel_call_timeout: float = Field(2.0, gt=0)
    #: Attempts of the asynchronous provider cancel (``stop_turn`` task), doubling from 1 s.
    stop_attempts: int = Field(5, ge=1, le=20)
    #: Hosts, ports and networks provider and webhook URLs may reach: comma-separated
    #: ``HOST``, ``HOST:PORT``, an IP, ``CIDR``, ``[IPV6]:PORT`` or ``[IPV6-CIDR]:PORT``
    #: entries. Empty by default (loopback too is the operator's to grant); metadata
    #: addresses only when listed exactly.
    provider_hosts: str = ""
    #: Secrets a workflow may name, each with the hosts it may be sent to, as JSON:
    #: ``{"AGENT_TOKEN": ["agents.example.com:443"]}``; the value is the worker's environment
    #: variable of that name.
    provider_secrets: dict[str, list[str]] = Field(default_factory=dict)
    #: One budget for a launch's lookups of the URL hosts not listed by name (seconds).
    launch_check_seconds: float = Field(2.0, gt=0, le=60)
    #: Most distinct host names a workflow may name that ``ORCH_PROVIDER_HOSTS`` does not
    #: list by name (each costs a lookup at launch).
    max_launch_hosts: int = Field(8, ge=1, le=64)
    #: Largest ``max_poll_interval`` a workflow may ask for (seconds).
    max_poll_interval_limit: float = Field(30.0, gt=0)
    #: Largest step ``timeout`` a workflow may ask for (seconds).
    max_step_timeout: float = Field(86400.0, gt=0)
    #: Most attempts a step's ``retry`` may ask for, and the longest wait between two.
    max_step_attempts: int = Field(10, ge=1)
    max_retry_backoff: float = Field(3600.0, gt=0)
    #: Longest ``expires_in`` an approval step may ask for (seconds).
    max_approval_expiry: float = Field(604800.0, gt=0)
    #: Most branches one ``for_each`` or ``parallel`` step may have, and one run in all.
    max_branches: int = Field(256, ge=1)
    max_branches_per_run: int = Field(1000, ge=1)
    #: With a value, beat deletes runs that ended more than this many days ago, once an hour
    #: (``orchestration prune`` does it by hand).
    retention_days: float | None = Field(None, gt=0)
    #: Most branches of one step running at once (``max_concurrency``, and its default).
    max_branch_concurrency: int = Field(32, ge=1)

    #: On PostgreSQL, send a decision's statements as one statement (data-modifying CTEs),
    #: with no transaction around those that stand alone (a poll's entry, a new step's
    #: claim, a launch); ``false`` sends the same statements one by one in a transaction, as
    #: on SQLite (``orchestration.core.pieces``).
    single_statement: bool = True

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

    #: ``json``: every log line is one JSON object with its run, step, attempt and task.
    log_format: Literal["text", "json"] = "text"
    #: OTLP/HTTP collector base URL for traces (off unless set, or ``OTEL_EXPORTER_OTLP_*``).
    otel_endpoint: str | None = None
    #: Seconds between two passes of the schedules (``every:`` shorter than this fires late).
    schedule_interval: float = Field(5.0, gt=0)
    #: The dashboard is reached over plain http on loopback (a developer's machine, the
    #: tests): its cookies are then not marked ``Secure``. Otherwise they always are, also
    #: when a proxy that ends TLS hands the app plain http.
    dashboard_plain_http: bool = False
    #: Workflows may name provider URLs themselves (``provider: http`` with its own ``url``)
    #: instead of a registered agent (``agent: NAME``). Off by default: the operator's agent
    #: registry (``orchestration agents``) is then the only way a tenant reaches a host.
    allow_raw_urls: bool = False

    # Shared loops (issue 30): each owner's share of a pass, taken round robin across owners.
    #: Most schedules one owner may register (refused at registration).
    max_schedules_per_owner: int = Field(100, ge=1, le=100_000)
    #: Most fires of one owner's schedules in one pass of the beat; the rest fire next pass.
    schedule_fires_per_owner: int = Field(10, ge=1, le=10_000)
    #: Most fires in one pass of the beat, all owners together.
    schedule_fires_per_pass: int = Field(500, ge=1, le=100_000)
    #: Most sweeper actions on one owner's runs in one pass; the rest are acted on next pass.
    sweep_actions_per_owner: int = Field(50, ge=1, le=100_000)
    #: Most provider cancels (``stop_turn`` tasks) of one owner's turns in flight at once.
    stop_turns_per_owner: int = Field(4, ge=1, le=1000)

    @field_validator("otel_endpoint")
    @classmethod
    def _otel_endpoint(cls, value: str | None) -> str | None:
        if value:
            check_web_url(value)
        return value or None

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        check_database_url(value)
        return value

    @field_validator("scripted_url", "webhook_url", "security_key", "security_certificate")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        """``export ORCH_WEBHOOK_URL=`` is how a shell unsets a variable for one process."""
        return value or None

    @field_validator("scripted_url")
    @classmethod
    def _scripted_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_database_url(value)
        return value

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str) -> str:
        check_broker_url(value)
        return value

    @field_validator("queue", "upkeep_queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        if not QUEUE_PATTERN.fullmatch(value) or value.startswith("amq."):
            raise ValueError(
                "must be a queue name: 1-200 letters, digits, '_', '.', ':' or '-', starting "
                "with a letter or digit (not 'amq.', which RabbitMQ reserves)"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _upkeep_queue_default(cls, data: Any) -> Any:
        """``ORCH_UPKEEP_QUEUE`` unset (or empty): ``ORCH_QUEUE`` + ``.upkeep`` (from the
        default queue when ``ORCH_QUEUE`` is refused, so that only that one is named)."""
        if not isinstance(data, dict) or data.get("upkeep_queue"):
            return data
        queue = str(data.get("queue", cls.model_fields["queue"].default))
        if not QUEUE_PATTERN.fullmatch(queue):
            queue = cls.model_fields["queue"].default
        return {**data, "upkeep_queue": f"{queue}{UPKEEP_SUFFIX}"}

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str) -> str:
        if not OWNER_PATTERN.fullmatch(value):
            raise ValueError("must be 1-200 printable ASCII characters without spaces")
        return value

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_web_url(value)
        return value

    @field_validator("revoke_signal")
    @classmethod
    def _revoke_signal(cls, value: str) -> str:
        name = value.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name not in signal.Signals.__members__ or name in NON_TERMINATING_SIGNALS:
            raise ValueError(
                "must be the name of a signal that ends a process, e.g. SIGKILL or SIGTERM"
            )
        return name

    @field_validator("security_key", "security_certificate")
    @classmethod
    def _readable_file(cls, value: str | None) -> str | None:
        if value is not None and not (os.path.isfile(value) and os.access(value, os.R_OK)):
            raise ValueError(f"must be the path of a readable PEM file; {value!r} is not one")
        return value

    @field_validator("security_cert_store")
    @classmethod
    def _cert_folder(cls, value: str | None) -> str | None:
        if value and not os.path.isdir(value):
            raise ValueError(f"must be the path of a folder of certificates; {value!r} is not one")
        return value or None

    @field_validator("provider_hosts")
    @classmethod
    def _provider_hosts(cls, value: str) -> str:
        AllowList.parse(value)
        return value

    @field_validator("provider_secrets", mode="before")
    @classmethod
    def _provider_secrets_json(cls, value: Any) -> Any:
        """The environment source decodes JSON itself; ``Settings(provider_secrets='…')``
        (a process's environment turned into arguments) is decoded here."""
        return decode_declared(value)

    @field_validator("provider_secrets")
    @classmethod
    def _provider_secrets(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return declared(value)

    @model_validator(mode="before")
    @classmethod
    def _provider_secrets_default(cls, data: Any) -> Any:
        """Validate the default declaration too, so that every ``Settings`` holds a hashable
        one (a plain dict would make the frozen settings unhashable). The environment source
        drops a variable whose JSON is ``null``; that is refused, not read as "none"."""
        if not isinstance(data, dict) or "provider_secrets" in data:
            return data
        if any(name.upper() == "ORCH_PROVIDER_SECRETS" for name in os.environ):
            raise ValueError(
                'ORCH_PROVIDER_SECRETS: must be a JSON object {"NAME": ["host:port", ...]}, '
                "not null"
            )
        return {**data, "provider_secrets": {}}

    @field_validator("*")
    @classmethod
    def _bounded_duration(cls, value: Any) -> Any:
        # Every float setting is a duration (in seconds; ORCH_RETENTION_DAYS in days).
        if isinstance(value, float) and value > MAX_SECONDS:
            raise ValueError(f"must be at most {MAX_SECONDS:.0f} seconds (ten years)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _postgres_guard(cls, data: Any) -> Any:
        """On PostgreSQL, let the server abort a transaction left idle longer than
        :func:`lock_release_seconds` (a worker frozen mid-transaction would otherwise hold its
        run's row until it wakes). A URL that sets its own ``options`` is left alone. Values
        that do not parse are left for the field validators, which name them."""
        if not isinstance(data, dict) or "database_url" not in data:
            return data
        try:
            url = make_url(str(data["database_url"]))
            provider = float(
                data.get("provider_timeout", cls.model_fields["provider_timeout"].default)
            )
        except (ArgumentError, ValueError, TypeError):
            return data
        if not url.drivername.startswith("postgres") or "options" in url.query:
            return data
        if not math.isfinite(provider) or not 0 < provider <= MAX_SECONDS:
            return data
        seconds = lock_release_seconds(provider)
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
        if self.upkeep_queue == self.queue:
            raise ValueError(
                f"ORCH_UPKEEP_QUEUE ({self.upkeep_queue!r}) must differ from ORCH_QUEUE: a "
                "sweeper pass on the step queue waits behind every step (chaos finding 12)"
            )
        if self.visibility_timeout <= 2 * self.heartbeat_timeout:
            raise ValueError(
                f"ORCH_VISIBILITY_TIMEOUT ({self.visibility_timeout}s) must exceed twice "
                f"ORCH_HEARTBEAT_TIMEOUT ({self.heartbeat_timeout}s), so Redis never "
                "redelivers a countdown message that is still waiting"
            )
        return self

    def park_budget(self, reason: str | None) -> float:
        """The budget in seconds for a park reason (the fallback for an unknown one); an
        approval's is its own ``expires_in``, at most ``ORCH_MAX_APPROVAL_EXPIRY``."""
        return {
            "human": self.park_budget_human,
            "engine_limit": self.park_budget_engine_limit,
            "platform_interrupt": self.park_budget_platform_interrupt,
            "branches": self.park_budget_branches,
            "approval": self.max_approval_expiry,
        }.get(reason or "", self.park_budget_default)


def lock_release_seconds(provider_timeout: float) -> float:
    """The longest a frozen writer holds a run's row on PostgreSQL before the server aborts its
    transaction. A step legitimately idles in a transaction for one provider start call (it
    holds the run row so that a cancel cannot slip in), so the bound is that call plus margin.
    """
    return provider_timeout + MARGIN_SECONDS


def _problem(error: ErrorDetails) -> str:
    """One error as ``ORCH_NAME: problem``, with the accepted form for a bad number."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message
    name = str(error["loc"][0])
    field = Settings.model_fields.get(name)
    if error["type"] != "value_error" and field is not None and field.annotation in (int, float):
        bounds = [
            f"{symbol} {getattr(rule, attr):g}"
            for rule in field.metadata
            for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
            if getattr(rule, attr, None) is not None
        ]
        if field.annotation is float:
            bounds.append(f"<= {MAX_SECONDS:.0f}")
        kind = "a number of seconds" if field.annotation is float else "a whole number"
        message += f" (got {str(error['input'])[:40]!r}); expected {kind} {' and '.join(bounds)}"
    return f"ORCH_{name.upper()}: {message}"


def load_settings() -> Settings:
    """Read settings from the environment; one :class:`ConfigurationError` names every bad
    ``ORCH_`` variable and the form it accepts."""
    try:
        return Settings()
    except PydanticValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
    except SettingsError as exc:
        # A JSON-typed setting (``ORCH_PROVIDER_SECRETS``) that is not JSON fails in the
        # environment source, before validation.
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"ORCH_{field.group(1).upper()}" if field else "an ORCH_ variable"
        problems = f"{name}: is not valid JSON ({exc.__cause__ or exc})"
    raise ConfigurationError("invalid settings: " + " ".join(problems.split()))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once)."""
    return load_settings()
