"""The bounds on what a tenant may launch, render and store: the base of the settings.

Kept apart from :mod:`orchestration.core.settings` (durations, URLs, their consistency) because
they are one concern, sizes and counts, read by the launch checks, the templates and the
artifact store.
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
