"""Settings: defaults, the consistency of the bounds, and the errors a misconfiguration gives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery
from celery.utils.imports import symbol_by_name
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from orchestration.core.db import get_engine, upgrade
from orchestration.core.errors import ConfigurationError
from orchestration.core.settings import MARGIN_SECONDS, Settings, load_settings
from orchestration.core.states import ParkReason
from orchestration.runtime.celery_config import FolderCreatingScheduler, NoResultBackend, configure
from tests.unit.support import PROPERTY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``ORCH_*`` variable from the developer's shell leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("ORCH_"):
            monkeypatch.delenv(name)


def test_defaults_load_and_are_consistent() -> None:
    settings = load_settings()
    assert settings == Settings()
    assert settings.database_url.startswith("sqlite:///")
    assert settings.heartbeat_timeout > (
        settings.max_poll_interval_limit + settings.provider_timeout + MARGIN_SECONDS
    )
    assert settings.visibility_timeout > 2 * settings.heartbeat_timeout
    assert settings.effect_policy == "fail"
    assert settings.scripted_url is None


def test_environment_variables_are_read_with_the_orch_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORCH_MAX_REARMS", "7")
    monkeypatch.setenv("ORCH_EFFECT_POLICY", "continue")
    monkeypatch.setenv("MAX_REARMS", "99")  # unprefixed: ignored
    settings = load_settings()
    assert (settings.max_rearms, settings.effect_policy) == (7, "continue")


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(PydanticValidationError):
        settings.max_rearms = 9  # type: ignore[misc]


_GAP = 30.0 + 10.0 + MARGIN_SECONDS  # default poll limit + provider timeout + margin


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [
        ({"heartbeat_timeout": _GAP}, "ORCH_HEARTBEAT_TIMEOUT"),
        ({"heartbeat_timeout": 5.0}, "ORCH_HEARTBEAT_TIMEOUT"),
        ({"max_poll_interval_limit": 60.0}, "ORCH_MAX_POLL_INTERVAL_LIMIT"),
        ({"provider_timeout": 50.0}, "ORCH_PROVIDER_TIMEOUT"),
        ({"visibility_timeout": 120.0}, "ORCH_VISIBILITY_TIMEOUT"),
        ({"visibility_timeout": 100.0}, "ORCH_VISIBILITY_TIMEOUT"),
        ({"heartbeat_timeout": 1800.0}, "ORCH_VISIBILITY_TIMEOUT"),
    ],
)
def test_inconsistent_bounds_are_refused(overrides: dict[str, float], variable: str) -> None:
    with pytest.raises(PydanticValidationError) as caught:
        Settings(**overrides)  # type: ignore[arg-type]
    assert variable in str(caught.value)


def test_bounds_just_inside_the_limits_are_accepted() -> None:
    settings = Settings(heartbeat_timeout=_GAP + 0.001, visibility_timeout=2 * _GAP + 0.01)
    assert settings.heartbeat_timeout == pytest.approx(_GAP + 0.001)


_SECONDS = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)


@PROPERTY
@given(heartbeat=_SECONDS, poll_limit=_SECONDS, provider=_SECONDS, visibility=_SECONDS)
def test_settings_load_exactly_when_the_bounds_are_consistent(
    heartbeat: float, poll_limit: float, provider: float, visibility: float
) -> None:
    consistent = heartbeat > poll_limit + provider + MARGIN_SECONDS and visibility > 2 * heartbeat
    try:
        Settings(
            heartbeat_timeout=heartbeat,
            max_poll_interval_limit=poll_limit,
            provider_timeout=provider,
            visibility_timeout=visibility,
        )
    except PydanticValidationError as exc:
        assert not consistent, exc
        assert re.search(r"ORCH_(HEARTBEAT|VISIBILITY)_TIMEOUT", str(exc))
    else:
        assert consistent


@pytest.mark.parametrize(
    ("environment", "variable"),
    [
        ({"ORCH_HEARTBEAT_TIMEOUT": "42"}, "ORCH_HEARTBEAT_TIMEOUT"),
        ({"ORCH_MAX_POLL_INTERVAL_LIMIT": "100"}, "ORCH_MAX_POLL_INTERVAL_LIMIT"),
        ({"ORCH_PROVIDER_TIMEOUT": "100"}, "ORCH_PROVIDER_TIMEOUT"),
        ({"ORCH_VISIBILITY_TIMEOUT": "119"}, "ORCH_VISIBILITY_TIMEOUT"),
    ],
)
def test_load_settings_turns_inconsistency_into_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], variable: str
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert variable in str(caught.value)
    assert caught.value.code == "configuration_error"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORCH_HEARTBEAT_TIMEOUT", "abc"),
        ("ORCH_MAX_REARMS", "-1"),
        ("ORCH_EFFECT_ATTEMPTS", "0"),
        ("ORCH_EFFECT_POLICY", "retry"),
        ("ORCH_SWEEP_INTERVAL", "0"),
    ],
)
def test_load_settings_turns_a_bad_value_into_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert name in str(caught.value), "the error names the variable the user set"


def test_each_park_reason_has_its_own_budget() -> None:
    settings = Settings(
        park_budget_human=1.0,
        park_budget_engine_limit=2.0,
        park_budget_platform_interrupt=3.0,
        park_budget_default=4.0,
        max_approval_expiry=5.0,
        park_budget_branches=6.0,
    )
    assert [settings.park_budget(reason) for reason in ParkReason] == [1.0, 2.0, 3.0, 5.0, 6.0]
    assert settings.park_budget(None) == 4.0
    assert settings.park_budget("something-else") == 4.0


def test_every_setting_is_documented() -> None:
    doc = ROOT / "docs" / "configuration.md"
    if not doc.exists():
        pytest.skip("docs/configuration.md does not exist yet")
    body = doc.read_text(encoding="utf-8")
    missing = [
        f"ORCH_{name.upper()}"
        for name in Settings.model_fields
        if not re.search(rf"\bORCH_{name.upper()}\b", body)
    ]
    assert not missing, f"docs/configuration.md does not document {missing}"


def test_postgres_connections_abort_transactions_left_idle_past_the_heartbeat() -> None:
    # A worker frozen mid-transaction must not hold its run's row forever (chaos finding A).
    guarded = Settings(database_url="postgresql://u@db/orch", provider_timeout=7)
    assert "idle_in_transaction_session_timeout%3D9000" in guarded.database_url
    own = "postgresql://u@db/orch?options=-c%20statement_timeout%3D5000"
    assert Settings(database_url=own).database_url == own
    assert Settings(database_url="sqlite:///x.db").database_url == "sqlite:///x.db"


# -- every setting validated at load (issue 15) ---------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "loaded"),
    [
        ("ORCH_REVOKE_SIGNAL", "term", "SIGTERM"),
        ("ORCH_REVOKE_SIGNAL", " sigkill ", "SIGKILL"),
        ("ORCH_WEBHOOK_URL", "", None),
        ("ORCH_WEBHOOK_URL", "https://hooks.example.com/x?a=1", "https://hooks.example.com/x?a=1"),
        (
            "ORCH_BROKER_URL",
            "amqp://guest@127.0.0.1//;amqp://b//",
            "amqp://guest@127.0.0.1//;amqp://b//",
        ),
        ("ORCH_BROKER_URL", "sentinel://127.0.0.1:26379", "sentinel://127.0.0.1:26379"),
        ("ORCH_QUEUE", "orchestration.eu-1:steps", "orchestration.eu-1:steps"),
        ("ORCH_SCRIPTED_URL", "", None),
        ("ORCH_DATABASE_URL", "postgres://u@db/orch?options=x", "postgres://u@db/orch?options=x"),
    ],
)
def test_the_accepted_forms_load(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, loaded: object
) -> None:
    monkeypatch.setenv(name, value)
    assert getattr(load_settings(), name[5:].lower()) == loaded


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ORCH_REVOKE_SIGNAL", "SIGFOO", "e.g. SIGKILL or SIGTERM"),
        ("ORCH_REVOKE_SIGNAL", "SIGSTOP", "ends a process"),
        ("ORCH_WEBHOOK_URL", "not-a-url", "http:// or https://"),
        ("ORCH_QUEUE", "", "queue name"),
        ("ORCH_QUEUE", "amq.steps", "RabbitMQ reserves"),
        ("ORCH_PROVIDER_TIMEOUT", "nan", "expected a number of seconds > 0"),
        ("ORCH_PARK_BUDGET_HUMAN", "1e300", "ten years"),
        ("ORCH_MAX_REARMS", "1.5", "expected a whole number >= 0"),
        ("ORCH_DATABASE_URL", "notaurl", "expected sqlite:///PATH or postgresql://"),
        ("ORCH_DATABASE_URL", "mysql://u@h/d", "'mysql' is not a supported database"),
        ("ORCH_DATABASE_URL", "postgresql+asyncpg://u@h/d", "asyncio driver"),
        ("ORCH_BROKER_URL", "http://127.0.0.1:6379/0", "unknown broker transport 'http'"),
        ("ORCH_BROKER_URL", "127.0.0.1:6379", "expected TRANSPORT://"),
        ("ORCH_SECURITY_KEY", "/nonexistent/key.pem", "readable PEM file"),
        ("ORCH_SECURITY_CERT_STORE", "/nonexistent/certs", "folder of certificates"),
        ("ORCH_PROVIDER_SECRETS", "{oops", "is not valid JSON"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable_and_the_form(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    message = str(caught.value)
    assert f"{name}:" in message and says in message
    assert "\n" not in message


def test_a_database_url_error_does_not_echo_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", "mysql://user:s3cret@db/orch")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)


def test_a_missing_postgres_driver_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ``None`` in sys.modules makes ``import psycopg`` fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setenv("ORCH_DATABASE_URL", "postgresql://u@127.0.0.1/orch")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "ORCH_DATABASE_URL" in str(caught.value)
    assert "pip install 'psycopg[binary]'" in str(caught.value)


def test_the_engine_refuses_a_missing_driver_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'psycopg\[binary\]'"):
        get_engine("postgresql://u@127.0.0.1/missing-driver-test")


def test_the_engine_creates_a_sqlite_folder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'x.db'}"
    Settings(database_url=url)  # a missing folder that can be created is fine at load
    upgrade(url)
    assert (tmp_path / "a" / "b" / "x.db").is_file()
    get_engine(url).dispose()


def test_a_sqlite_folder_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigurationError, match="cannot create the folder"):
        get_engine(f"sqlite:///{blocker / 'sub' / 'x.db'}")


def test_no_result_backend_knows_no_task_and_keeps_nothing() -> None:
    # Celery's revoke handler asks every revoked task's state (celery.worker.control._revoke);
    # the disabled backend raised there, and each cancel logged a warning.
    app = configure(Celery("t", set_as_current=False), Settings())
    assert isinstance(app.backend, NoResultBackend)
    assert app.backend.get_state("some-task") == "PENDING"
    app.backend.mark_as_revoked("some-task", reason="revoked", store_result=True)
    with pytest.raises(NotImplementedError):
        app.backend.get_task_meta_for("some-task")


def test_beat_creates_the_folder_of_its_schedule_file(tmp_path: Path) -> None:
    app = configure(Celery("t", set_as_current=False), Settings(broker_url="memory://"))
    schedule = tmp_path / "missing" / "beat-schedule"
    scheduler = symbol_by_name(app.conf.beat_scheduler)(
        app=app, schedule_filename=str(schedule), lazy=True
    )
    assert isinstance(scheduler, FolderCreatingScheduler)
    scheduler.setup_schedule()
    scheduler.close()
    assert schedule.parent.is_dir()


def test_a_command_on_sqlite_never_imports_psycopg(tmp_path: Path) -> None:
    """psycopg costs a CLI command 0.09 s at import; on SQLite nothing needs it."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    script = (
        "import sys\n"
        "from sqlalchemy import text\n"
        "import orchestration.surfaces.cli\n"
        "from orchestration.core.db import session_scope, upgrade\n"
        f"upgrade({url!r})\n"
        f"with session_scope({url!r}) as session:\n"
        "    session.execute(text('SELECT 1'))\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'psycopg'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
