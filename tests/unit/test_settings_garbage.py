"""Garbage in any ``ORCH_`` variable: every command refuses it in one line naming the variable.

Each field of :class:`Settings` gets a strategy of values that are invalid *for that field*
(a string field accepts most text, so its garbage is what its documented form excludes).
Numbers, and choices, get theirs from the field's type and bounds, so a new numeric setting is
covered without touching this file; a new setting of any other type fails
:func:`test_every_setting_has_garbage` until its garbage is written here.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest
import typer.main
import typer.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from kombu.transport import TRANSPORT_ALIASES
from pydantic.fields import FieldInfo
from typer.testing import CliRunner

from orchestration.core.settings import MAX_SECONDS, Settings, get_settings
from orchestration.surfaces.cli import app

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "orchestration")
RUNNER = CliRunner()
#: Valid values for the variables not under test; nothing is reachable or written through
#: them, even if a garbage value were (wrongly) accepted.
BASE_ENV = {"ORCH_BROKER_URL": "memory://"}

#: Text an environment variable can hold (no NUL, no lone surrogate).
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
    max_size=40,
)


def _scheme_url(accepted: Callable[[str], bool]) -> SearchStrategy[str]:
    """``SCHEME://…`` URLs whose scheme is not accepted."""
    return st.from_regex(r"\A[a-z][a-z0-9]{0,9}(\+[a-z0-9]{1,8})?://[a-z0-9./@:]{0,20}\Z").filter(
        lambda url: not accepted(url.partition("://")[0])
    )


def _database_urls(*, empty_is_unset: bool) -> SearchStrategy[str]:
    no_url = TEXT.filter(lambda text: "://" not in text and (text or not empty_is_unset))
    return st.one_of(
        no_url,
        _scheme_url(lambda scheme: scheme.split("+")[0] in ("sqlite", "postgresql", "postgres")),
        st.sampled_from(
            [
                "mysql://u@127.0.0.1/db",
                "postgresql+asyncpg://u@127.0.0.1/db",
                "postgresql+nosuchdriver://u@127.0.0.1/db",
                "sqlite+nosuchdriver:///x.db",
            ]
        ),
    )


def _missing_paths() -> SearchStrategy[str]:
    return TEXT.map(lambda text: "/nonexistent-orchestration/" + text).filter(
        lambda path: not os.path.exists(path)
    )


def _terminating(value: str) -> bool:
    name = value.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    return name in signal.Signals.__members__ and name not in _NON_TERMINATING


_NON_TERMINATING = {"SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG"}
#: The documented queue name: letters, digits, ``_ . : -``, 1-200, not RabbitMQ's ``amq.``.
_QUEUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")


def _valid_secrets(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if value is None:  # JSON null: no secrets declared, like the default
        return True
    return isinstance(value, dict) and all(
        isinstance(hosts, list) and all(isinstance(host, str) for host in hosts)
        for hosts in value.values()
    )


#: Garbage for the settings whose type does not say what is invalid.
TEXT_GARBAGE: dict[str, SearchStrategy[str]] = {
    "retention_days": st.one_of(
        st.from_regex(r"\A[A-Za-z]{1,12}\Z"),
        st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "-1", "-0.5"]),
    ),
    "database_url": _database_urls(empty_is_unset=False),
    "artifact_dir": st.one_of(
        TEXT.filter(lambda text: bool(text) and not text.startswith("/")),
        st.sampled_from(["artifacts", "./artifacts", "~/artifacts", "a/b"]),
    ),
    "scripted_url": _database_urls(empty_is_unset=True),
    "broker_url": st.one_of(
        TEXT.filter(lambda text: "://" not in text),
        _scheme_url(lambda scheme: scheme.split("+")[0] in TRANSPORT_ALIASES),
        st.sampled_from(["http://127.0.0.1:6379/0", "redis://127.0.0.1;nonsense"]),
    ),
    "owner": st.one_of(
        st.just(""),
        TEXT.filter(lambda text: any(not "\x21" <= char <= "\x7e" for char in text)),
        st.text(alphabet="ab", min_size=201, max_size=260),
    ),
    "queue": st.one_of(
        st.sampled_from(["", " ", "orchestration queue", "amq.orchestration", "-q", "q\n"]),
        TEXT.filter(lambda text: not _QUEUE.fullmatch(text) or text.startswith("amq.")),
        st.text(alphabet="q", min_size=201, max_size=260),
    ),
    "webhook_url": st.one_of(
        TEXT.filter(lambda text: bool(text) and not re.match(r"(?i)https?://", text)),
        st.sampled_from(["not-a-url", "http://", "https://:443/hook", "ftp://example.com/x"]),
        TEXT.filter(lambda text: any(c.isspace() or not c.isprintable() for c in text)).map(
            lambda text: "https://example.com/" + text
        ),
    ),
    "revoke_signal": st.one_of(
        TEXT.filter(lambda text: not _terminating(text)),
        st.sampled_from(["SIGFOO", "SIGSTOP", "CONT", "9", ""]),
    ),
    "security_key": st.one_of(_missing_paths(), st.just("/")),
    "security_certificate": st.one_of(_missing_paths(), st.just("/")),
    "security_cert_store": st.one_of(_missing_paths(), st.just(__file__)),
    "provider_secrets": st.one_of(
        TEXT.filter(lambda text: not _valid_secrets(text)),
        st.sampled_from(["[]", '"x"', "1", '{"A": "host"}', '{"A": [1]}', "{"]),
        # Well-typed, but not an environment variable name or not a host.
        st.sampled_from(['{"": ["localhost"]}', '{"a b": ["localhost"]}', '{"A": ["!!"]}']),
        st.sampled_from(['{"A": []}', '{"A": ["300.1.2.3"]}', '{"A": ["h:99999"]}']),
    ),
    "provider_hosts": st.one_of(
        # Blank is left out: the allow-list reads it as empty (no host allowed).
        st.text(alphabet="!#$%^&*(){}<>|\"' ", min_size=1, max_size=20).filter(str.strip),
        st.sampled_from(["300.1.2.3", "10.0.0.0/99", "host:notaport", "host:99999", "a b"]),
    ),
}
#: The OTLP endpoint is a web URL like the webhook's, refused the same way.
TEXT_GARBAGE["otel_endpoint"] = TEXT_GARBAGE["webhook_url"]
#: Empty is not garbage there: it means ``ORCH_QUEUE`` + ``.upkeep``; the step queue's name is.
TEXT_GARBAGE["upkeep_queue"] = st.one_of(
    st.sampled_from([" ", "upkeep queue", "amq.upkeep", "-q", "q\n", "orchestration"]),
    TEXT.filter(
        lambda text: text != "" and (not _QUEUE.fullmatch(text) or text.startswith("amq."))
    ),
    st.text(alphabet="q", min_size=201, max_size=260),
)
#: pydantic reads a boolean from these words, in any case, and from nothing else.
_BOOLEAN_WORDS = {"1", "0", "true", "false", "t", "f", "yes", "no", "y", "n", "on", "off"}
TEXT_GARBAGE["dashboard_plain_http"] = st.one_of(
    TEXT.filter(lambda text: text.strip().lower() not in _BOOLEAN_WORDS),
    st.sampled_from(["", "2", "maybe", "http", "enabled"]),
)


def _numbers(field: FieldInfo) -> SearchStrategy[str]:
    """Text that is not a number of the field's type within its bounds."""
    integer = field.annotation is int
    low = next(rule for rule in field.metadata if hasattr(rule, "gt") or hasattr(rule, "ge"))
    high = next((rule.le for rule in field.metadata if hasattr(rule, "le")), None)
    words = st.from_regex(r"\A[A-Za-z]{1,12}\Z")
    non_finite = st.sampled_from(["nan", "NaN", "inf", "-inf", "+Infinity", "1e400", ""])
    if integer:
        floor = int(getattr(low, "ge", getattr(low, "gt", 0)))
        below = st.integers(max_value=floor - 1, min_value=floor - 10**12).map(str)
        fraction = st.floats(allow_nan=False, allow_infinity=False).filter(
            lambda x: not x.is_integer()
        )
        parts = [words, non_finite, below, fraction.map(repr)]
        if high is not None:
            parts.append(st.integers(min_value=int(high) + 1, max_value=10**12).map(str))
        return st.one_of(*parts)
    if hasattr(low, "gt"):
        below_floats = st.floats(max_value=float(low.gt), allow_nan=False, min_value=-1e300)
    else:
        below_floats = st.floats(
            max_value=float(low.ge), exclude_max=True, allow_nan=False, min_value=-1e300
        )
    above = st.floats(min_value=MAX_SECONDS * 1.001, max_value=1e300)
    return st.one_of(words, non_finite, below_floats.map(repr), above.map(repr))


#: What pydantic reads as a boolean.
_BOOLEAN_WORDS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def garbage_for(name: str) -> SearchStrategy[str]:
    """The invalid values of one setting; ``KeyError`` for a setting nobody wrote them for."""
    field = Settings.model_fields[name]
    if field.annotation in (int, float):
        return _numbers(field)
    if field.annotation is bool:
        return TEXT.filter(lambda text: text.strip().lower() not in _BOOLEAN_WORDS)
    if get_origin(field.annotation) is Literal:
        choices = {str(choice) for choice in get_args(field.annotation)}
        return TEXT.filter(lambda text: text not in choices)
    return TEXT_GARBAGE[name]


@pytest.fixture(autouse=True, scope="module")
def _command_built_once() -> Iterator[None]:
    """Typer's runner builds the click command tree from the app on every invoke, three
    quarters of an invoke here; the tree is the same for each of this module's ~1,500."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", cache(typer.main.get_command))
        yield


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _environment(tmp: Path, name: str, value: str) -> dict[str, str | None]:
    """No ORCH_ variable of the developer's shell, the valid base, and the garbage."""
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("ORCH_")}
    env.update(BASE_ENV, ORCH_DATABASE_URL=f"sqlite:///{tmp / 'garbage.db'}")
    env[f"ORCH_{name.upper()}"] = value
    return env


def assert_refused_in_one_line(tmp: Path, name: str, value: str) -> None:
    """``orchestration health`` with ``ORCH_<NAME>=value`` exits 2 with one stderr line that
    names the variable, and no traceback."""
    get_settings.cache_clear()
    result = RUNNER.invoke(app, ["health"], env=_environment(tmp, name, value))
    variable = f"ORCH_{name.upper()}"
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (variable, value, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    assert len(lines) == 1 and variable in lines[0], (variable, value, lines)
    assert lines[0].startswith("error: invalid settings: ")
    assert result.stdout == "" and "Traceback" not in result.output


def test_every_setting_has_garbage() -> None:
    missing = [name for name in Settings.model_fields if not _has_garbage(name)]
    assert not missing, f"write the garbage of {missing} in TEXT_GARBAGE"
    assert len(Settings.model_fields) >= 40


def _has_garbage(name: str) -> bool:
    try:
        garbage_for(name)
    except KeyError:
        return False
    return True


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_garbage_in_any_setting_is_one_line_naming_it(name: str, tmp_path: Path) -> None:
    @settings(max_examples=25, deadline=None, database=None)
    @given(value=garbage_for(name))
    def refused(value: str) -> None:
        assert_refused_in_one_line(tmp_path, name, value)

    refused()


def test_non_finite_numbers_are_refused_for_every_float_setting(tmp_path: Path) -> None:
    floats = [name for name, field in Settings.model_fields.items() if field.annotation is float]
    assert floats
    for name in floats:
        for value in ("nan", "inf", "-inf"):
            assert_refused_in_one_line(tmp_path, name, value)
    assert math.isfinite(MAX_SECONDS)


#: The misconfigurations of issue 15, each with the command a newcomer ran.
ISSUE_EXAMPLES = [
    ("ORCH_REVOKE_SIGNAL", "SIGFOO", "health"),
    ("ORCH_WEBHOOK_URL", "not-a-url", "runs"),
    ("ORCH_QUEUE", "", "health"),
    ("ORCH_PROVIDER_TIMEOUT", "nan", "runs"),
    ("ORCH_DATABASE_URL", "notaurl", "db"),
    ("ORCH_BROKER_URL", "http://127.0.0.1:6379/0", "health"),
    ("ORCH_PROVIDER_SECRETS", "{not json", "worker"),
]


@pytest.mark.parametrize(("variable", "value", "command"), ISSUE_EXAMPLES)
def test_the_installed_command_refuses_in_one_line(
    tmp_path: Path, variable: str, value: str, command: str
) -> None:
    env = {key: val for key, val in os.environ.items() if not key.startswith("ORCH_")}
    env.update(BASE_ENV, ORCH_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}")
    env[variable] = value
    argv = [CLI, *(["db", "upgrade"] if command == "db" else [command])]
    result = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and variable in lines[0], lines
    assert not (tmp_path / "x.db").exists(), "nothing is written with bad settings"


def test_the_installed_command_refuses_in_json_with_json(tmp_path: Path) -> None:
    env = {key: val for key, val in os.environ.items() if not key.startswith("ORCH_")}
    env.update(BASE_ENV, ORCH_QUEUE="two words")
    result = subprocess.run(
        [CLI, "runs", "--json"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "configuration_error" and "ORCH_QUEUE" in error["message"]
