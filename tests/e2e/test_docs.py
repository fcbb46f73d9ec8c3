"""The documentation is checked against the code, and its examples are regenerated from it.

Fast checks (always run, well under ten seconds):

* the state tables in ``docs/concepts.md`` are exactly what :mod:`orchestration.core.states` renders
  to (statuses, transitions, stop reasons, park reasons, health, effect statuses);
* ``docs/configuration.md`` lists every :class:`~orchestration.core.settings.Settings` field as
  ``ORCH_<NAME>`` with its real default, and names no ``ORCH_`` variable the code does not read;
* every ``orchestration ...`` command shown in ``README.md`` and ``docs/*.md`` is a real command
  of the CLI, with real options;
* every command block carries a ``doc-test`` marker (``tests/docs`` runs the marked ones);
* ``examples/flask_app.py`` serves launch, read, cancel and answer with the documented errors
  (skipped when Flask is not installed).

Regeneration (slow, real processes): with ``ORCH_REGENERATE_DOCS=1`` the state tables are
rewritten instead of compared, and :func:`test_explain_examples` runs the system (a broker,
SQLite, real workers, the CLI) and rewrites every ``<!-- example:NAME -->`` block in the docs
with the real output. ``ORCH_DOCS_BROKER_URL`` selects a broker (e.g. Redis); without it an
embedded broker is started::

    ORCH_REGENERATE_DOCS=1 ORCH_DOCS_BROKER_URL=redis://127.0.0.1:6379/14 \\
        .venv/bin/pytest tests/e2e/test_docs.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import typer.main
from pydantic_core import PydanticUndefined

from orchestration.core import states
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    STEP_TERMINAL,
    STEP_TRANSITIONS,
    STOP_REASONS,
    EffectStatus,
    Health,
    ParkReason,
    RunStatus,
    StepStatus,
    StopReason,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGENERATE = os.environ.get("ORCH_REGENERATE_DOCS", "") == "1"


# -- marked regions --------------------------------------------------------------------------
# A region is "<!-- KIND:NAME -->", its body, then "<!-- /KIND:NAME -->". ``generated`` regions
# hold tables rendered from code (checked exactly); ``example`` regions hold real output.


def _region_re(kind: str, name: str = r"[a-z0-9-]+") -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- {kind}:(?P<name>{name}) -->\n)(?P<body>.*?)(<!-- /{kind}:(?P=name) -->)",
        re.S,
    )


def regions(text: str, kind: str) -> dict[str, str]:
    """The bodies of every ``kind`` region in ``text``, by name."""
    return {m["name"]: m["body"] for m in _region_re(kind).finditer(text)}


def replace_regions(text: str, kind: str, bodies: Mapping[str, str]) -> str:
    """``text`` with the body of each named ``kind`` region replaced."""

    def swap(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in bodies:
            return match[0]
        return f"{match[1]}{bodies[name].rstrip()}\n{match[4]}"

    return _region_re(kind).sub(swap, text)


# -- the state tables, rendered from orchestration/core/states.py ---------------------------------


def _markdown(text: str) -> str:
    """reST inline markup of the ``#:`` comments as Markdown."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def member_docs() -> dict[str, dict[str, str]]:
    """The ``#:`` comment of every enum member in ``states.py``: {class: {member: text}}."""
    docs: dict[str, dict[str, str]] = {}
    current: str | None = None
    pending: list[str] = []
    for line in Path(states.__file__).read_text(encoding="utf-8").splitlines():
        if match := re.match(r"class (\w+)\(", line):
            current, pending = match[1], []
            docs[current] = {}
        elif line.strip().startswith("#:"):
            pending.append(line.strip()[2:].strip())
        elif current and (match := re.match(r"    ([A-Z_]+) = \"", line)):
            docs[current][match[1]] = _markdown(" ".join(pending))
            pending = []
        else:
            pending = []
    return docs


def _codes(values: list[StrEnum]) -> str:
    return ", ".join(f"`{value.value}`" for value in values)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def render_state_tables() -> dict[str, str]:
    """Every table of ``docs/concepts.md`` that ``states.py`` decides, by region name."""
    docs = member_docs()
    defaults = Settings.model_fields

    def meaning(enum: type[StrEnum], member: StrEnum) -> str:
        return docs[enum.__name__][member.name]

    run_statuses = [
        (
            f"`{s.value}`",
            "terminal" if s in RUN_TERMINAL else "live",
            meaning(RunStatus, s),
        )
        for s in RunStatus
    ]
    step_statuses = [
        (
            f"`{s.value}`",
            "terminal" if s in STEP_TERMINAL else "live",
            meaning(StepStatus, s),
        )
        for s in StepStatus
    ]
    run_moves = [
        (
            f"`{s.value}`",
            _codes([t for t in RunStatus if t in RUN_TRANSITIONS[s]]) or "nothing (final)",
        )
        for s in RunStatus
    ]
    step_moves = [
        (
            f"`{s.value}`",
            _codes([t for t in StepStatus if t in STEP_TRANSITIONS[s]]) or "nothing (final)",
        )
        for s in StepStatus
    ]
    stop_reasons = [
        (
            f"`{reason.value}`",
            next(
                f"`{status.value}`" for status, allowed in STOP_REASONS.items() if reason in allowed
            ),
            meaning(StopReason, reason),
        )
        for reason in StopReason
    ]
    park_reasons = []
    for reason in ParkReason:
        name = f"park_budget_{reason.value}"
        budget = (
            f"its `expires_in` (at most `ORCH_MAX_APPROVAL_EXPIRY`, "
            f"{_seconds(defaults['max_approval_expiry'].default)})"
            if reason is ParkReason.APPROVAL
            else f"`ORCH_{name.upper()}` ({_seconds(defaults[name].default)})"
        )
        park_reasons.append((f"`{reason.value}`", budget, meaning(ParkReason, reason)))
    return {
        "run-statuses": _table(("status", "kind", "meaning"), run_statuses),
        "step-statuses": _table(("status", "kind", "meaning"), step_statuses),
        "run-transitions": _table(("from", "may move to"), run_moves),
        "step-transitions": _table(("from", "may move to"), step_moves),
        "stop-reasons": _table(("stop reason", "run status", "meaning"), stop_reasons),
        "park-reasons": _table(("park reason", "budget (default)", "meaning"), park_reasons),
        "health": _table(
            ("health", "meaning"), [(f"`{h.value}`", meaning(Health, h)) for h in Health]
        ),
        "effect-statuses": _table(
            ("effect status", "meaning"),
            [(f"`{e.value}`", meaning(EffectStatus, e)) for e in EffectStatus],
        ),
    }


def test_every_state_member_has_a_doc_comment() -> None:
    docs = member_docs()
    for enum in (RunStatus, StepStatus, StopReason, ParkReason, Health, EffectStatus):
        missing = [m.name for m in enum if not docs.get(enum.__name__, {}).get(m.name)]
        assert not missing, f"{enum.__name__} members without a `#:` comment: {missing}"


def test_concepts_tables_match_states() -> None:
    doc = DOCS / "concepts.md"
    text = doc.read_text(encoding="utf-8")
    rendered = render_state_tables()
    if REGENERATE:
        doc.write_text(replace_regions(text, "generated", rendered), encoding="utf-8")
        text = doc.read_text(encoding="utf-8")
    found = regions(text, "generated")
    assert set(found) == set(rendered), (
        f"docs/concepts.md generated regions {sorted(found)} != {sorted(rendered)}"
    )
    stale = [name for name, body in rendered.items() if found[name] != body]
    assert not stale, (
        f"docs/concepts.md tables {stale} differ from orchestration/core/states.py; rewrite them "
        "with ORCH_REGENERATE_DOCS=1 .venv/bin/pytest tests/e2e/test_docs.py"
    )


def render_scripted_options() -> str:
    """The table of the scripted provider's ``with:`` options (``docs/providers.md``)."""
    from orchestration.providers.scripted_options import OPTIONS

    return _table(
        ("option", "what it does"), [(f"`{name}`", text) for name, text in OPTIONS.items()]
    )


def test_providers_lists_every_scripted_option() -> None:
    """Every option ``scripted_options.check`` accepts is documented, with what it does, and
    nothing else is (issue 33: they showed up only in an error's list of known options)."""
    from orchestration.providers.scripted_options import KNOWN

    doc = DOCS / "providers.md"
    text = doc.read_text(encoding="utf-8")
    rendered = {"scripted-options": render_scripted_options()}
    if REGENERATE:
        doc.write_text(replace_regions(text, "generated", rendered), encoding="utf-8")
        text = doc.read_text(encoding="utf-8")
    found = regions(text, "generated")
    assert found.get("scripted-options") == rendered["scripted-options"], (
        "docs/providers.md's scripted options differ from orchestration/providers/"
        "scripted_options.py; rewrite them with ORCH_REGENERATE_DOCS=1 .venv/bin/pytest "
        "tests/e2e/test_docs.py"
    )
    shown = set(re.findall(r"^\| `(\w+)` \|", rendered["scripted-options"], re.M))
    assert shown == set(KNOWN)


# -- settings ----------------------------------------------------------------------------------


def render_default(name: str) -> str:
    """A setting's default as ``docs/configuration.md`` writes it."""
    value = Settings.model_fields[name].get_default(call_default_factory=True)
    assert value is not PydanticUndefined, f"setting {name} has no default"
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


_SETTING_ROW = re.compile(r"^\| `ORCH_([A-Z0-9_]+)` \| ([^|]+?) \|", re.M)


def test_configuration_lists_every_setting_with_its_default() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = {name.lower(): default for name, default in _SETTING_ROW.findall(text)}
    fields = set(Settings.model_fields)
    assert not fields - set(rows), f"settings missing from the table: {sorted(fields - set(rows))}"
    assert not set(rows) - fields, f"table rows that are not settings: {sorted(set(rows) - fields)}"
    wrong = {
        name: (rows[name], render_default(name))
        for name in fields
        if rows[name] != render_default(name)
    }
    assert not wrong, f"documented defaults differ from Settings (doc, code): {wrong}"
    for name in fields:
        assert f"ORCH_{name.upper()}" in text


def _code_text() -> str:
    parts = [ROOT / "beat_schedule.py", ROOT / ".ci" / "run"]
    for folder in ("orchestration", "tasks", "tests"):
        parts += sorted((ROOT / folder).rglob("*.py"))
    return "\n".join(p.read_text(encoding="utf-8") for p in parts if p.is_file())


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_docs_name_only_orch_variables_that_exist() -> None:
    """A typo in a documented variable is silently ignored by ``extra="ignore"``; catch it."""
    known = {f"ORCH_{name.upper()}" for name in Settings.model_fields}
    known |= set(re.findall(r"ORCH_[A-Z0-9_]*[A-Z0-9]", _code_text()))
    unknown = {
        f"{path.name}: {name}"
        for path in _doc_files()
        if path.exists()
        for name in re.findall(r"ORCH_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))
        if name not in known and not name.startswith("ORCH_PARK_BUDGET_")
    }
    assert not unknown, f"docs name ORCH_ variables the code never reads: {sorted(unknown)}"


# -- CLI commands in the docs ----------------------------------------------------------------

_SHELL_LANGS = {"bash", "sh", "shell"}


def _command_lines(text: str) -> Iterator[str]:
    """Shell lines that may hold commands: every line of a bash block, ``$ `` lines of other
    blocks, and inline code spans."""
    in_block: str | None = None
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            in_block = None if in_block is not None else (fence[1] or "text")
            continue
        if in_block is None:
            yield from re.findall(r"`([^`\n]+)`", line)
        elif in_block in _SHELL_LANGS:
            yield line.strip().removeprefix("$ ")
        elif line.startswith("$ "):
            yield line[2:]


def _is_orchestration(token: str) -> bool:
    return token == "orchestration" or token.endswith("/bin/orchestration")


def documented_commands() -> list[tuple[str, list[str]]]:
    """(file, argv after ``orchestration``) for every command shown in the docs."""
    found: list[tuple[str, list[str]]] = []
    for path in _doc_files():
        if not path.exists():
            continue
        for line in _command_lines(path.read_text(encoding="utf-8")):
            if "orchestration" not in line:
                continue
            try:
                lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
                lexer.whitespace_split = True
                tokens = list(lexer)
            except ValueError:
                continue  # not shell (e.g. prose in backticks with an apostrophe)
            segment: list[str] = []
            for token in [*tokens, ";"]:
                if token in {"&&", "||", ";", "|", "&", "(", ")"}:
                    while segment and re.match(r"^[A-Z_][A-Z0-9_]*=", segment[0]):
                        segment.pop(0)  # VAR=value before the command
                    # A bare ``orchestration`` is the name (of the project, the queue), not a
                    # command.
                    if len(segment) > 1 and _is_orchestration(segment[0]):
                        found.append((path.name, segment[1:]))
                    segment = []
                else:
                    segment.append(token)
    return found


def _check_command(root: Any, argv: list[str]) -> str | None:
    """Why ``orchestration argv`` is not a real command (``None`` when it is).

    Duck-typed on purpose: typer vendors its own click, so ``isinstance`` against the
    ``click`` package would never match.
    """
    command = root
    rest = list(argv)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        sub = command.commands.get(rest[0])
        if sub is None:
            return f"no command {rest[0]!r} (known: {sorted(command.commands)})"
        command, rest = sub, rest[1:]
    if "--help" in rest:
        return None
    if hasattr(command, "commands"):
        return f"{command.name!r} needs a subcommand ({sorted(command.commands)})"
    if (command.context_settings or {}).get("ignore_unknown_options"):
        return None  # worker and beat pass their options on to Celery
    options = {"--help"}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            options.update(param.opts, param.secondary_opts)
    for token in rest:
        if token.startswith("-") and token != "-" and token.split("=")[0] not in options:
            return f"{command.name!r} has no option {token.split('=')[0]!r}"
    return None


def test_every_documented_command_is_a_real_command() -> None:
    from orchestration.surfaces.cli import app

    root = typer.main.get_command(app)
    commands = documented_commands()
    assert len(commands) >= 20, f"found only {len(commands)} commands in the docs: parser broken?"
    problems = [
        f"{name}: orchestration {shlex.join(argv)}: {why}"
        for name, argv in commands
        if (why := _check_command(root, argv)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_every_top_level_command_is_documented() -> None:
    from orchestration.surfaces.cli import app

    root: Any = typer.main.get_command(app)
    shown = {argv[0] for _, argv in documented_commands() if argv}
    assert not set(root.commands) - shown, f"undocumented: {sorted(set(root.commands) - shown)}"


def test_every_command_block_is_marked_for_the_docs_tests() -> None:
    """Each command block is run by ``tests/docs`` or says visibly why not (see
    ``docs/contributing.md``); the markers parse."""
    from tests.docs.blocks import parse, problems

    found = [problem for path in _doc_files() if path.exists() for problem in problems(parse(path))]
    assert not found, "\n".join(found)


def test_example_regions_are_filled() -> None:
    """Every ``example`` region holds output (an empty one means a generator run was cut)."""
    for path in sorted(DOCS.glob("*.md")):
        for name, body in regions(path.read_text(encoding="utf-8"), "example").items():
            assert body.strip().startswith("```") and len(body) > 40, f"{path.name}: {name}"


# -- the Flask example -----------------------------------------------------------------------


def _flask_example() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("flask_app", ROOT / "examples" / "flask_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flask_example_serves_the_python_api(tmp_path: Path) -> None:
    pytest.importorskip("flask")
    from orchestration.core.db import upgrade
    from orchestration.service import Orchestrator

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'flask.db'}")
    upgrade(settings.database_url)
    # No dispatcher: launches are written, nothing is sent; enough to check the HTTP mapping.
    example = _flask_example()
    app = example.create_app(Orchestrator(settings, None), tokens={"tok-a": "a", "tok-b": "b"})
    client = app.test_client()
    auth = {"Authorization": "Bearer tok-a"}

    assert client.get("/runs").status_code == 401
    body = {"workflow": "research", "args": {"topic": "octopuses"}}
    first = client.post("/runs", json=body, headers={**auth, "Idempotency-Key": "k1"})
    assert first.status_code == 201, first.json
    run_id = first.json["id"]
    again = client.post("/runs", json=body, headers={**auth, "Idempotency-Key": "k1"})
    assert (again.status_code, again.json["id"]) == (201, run_id)
    other = {"workflow": "research", "args": {"topic": "squid"}}
    clash = client.post("/runs", json=other, headers={**auth, "Idempotency-Key": "k1"})
    assert (clash.status_code, clash.json["error"]["code"]) == (409, "idempotency_conflict")
    bad = client.post("/runs", json={"workflow": "research"}, headers=auth)
    assert bad.status_code == 400
    assert bad.json["error"] == {
        "code": "validation_error",
        "field": "steps[0].task",
        "message": "steps[0].task: placeholder {{ args.topic }}: 'topic' is not there",
    }
    unknown = client.post("/runs", json={"workflow": "nope"}, headers=auth)
    assert (unknown.status_code, unknown.json["error"]["field"]) == (400, "workflow")

    assert client.get(f"/runs/{run_id}", headers=auth).json["status"] == "queued"
    assert [r["id"] for r in client.get("/runs", headers=auth).json["runs"]] == [run_id]
    hidden = client.get(f"/runs/{run_id}", headers={"Authorization": "Bearer tok-b"})
    assert (hidden.status_code, hidden.json["error"]["code"]) == (404, "not_found")
    assert "queued" in client.get(f"/runs/{run_id}/explain", headers=auth).json["text"]
    answer = client.post(
        f"/runs/{run_id}/answer", json={"step": "research", "value": 1}, headers=auth
    )
    assert (answer.status_code, answer.json["error"]["code"]) == (409, "conflict")
    nan = client.post(
        f"/runs/{run_id}/answer",
        data='{"step": "research", "value": NaN}',
        headers={**auth, "Content-Type": "application/json"},
    )
    assert (nan.status_code, nan.json["error"]["field"]) == (400, "value")
    cancelled = client.post(f"/runs/{run_id}/cancel", headers=auth)
    assert (cancelled.status_code, cancelled.json["status"]) == (200, "cancelled")
    assert cancelled.json["stop_reason"] == "cancel_requested"


# -- regenerating the examples: the real system, the real CLI ----------------------------------

#: The bounds of the explain examples, shrunk like ``tests/integration/conftest.py``'s
#: ``FAST_SETTINGS`` so a dead heartbeat shows within seconds.
EXAMPLE_SETTINGS = {
    "ORCH_HEARTBEAT_TIMEOUT": "8",
    "ORCH_MAX_POLL_INTERVAL_LIMIT": "2",
    "ORCH_PROVIDER_TIMEOUT": "3",
    "ORCH_VISIBILITY_TIMEOUT": "60",
    "ORCH_SWEEP_INTERVAL": "1",
    "ORCH_CANCEL_GRACE": "2",
    "ORCH_MAX_REARMS": "2",
    "ORCH_PARK_BUDGET_HUMAN": "60",
    "ORCH_PARK_BUDGET_ENGINE_LIMIT": "8",
    "ORCH_PARK_BUDGET_PLATFORM_INTERRUPT": "30",
    "ORCH_PARK_BUDGET_DEFAULT": "8",
}

#: The scripted workflows of the explain examples (written to files, launched with the CLI).
EXAMPLE_WORKFLOWS = {
    "approval.yaml": """\
# Works briefly, then asks a human.
name: approval
steps:
  - id: draft
    provider: scripted
    task: "Draft a plan"
    poll_interval: 0.2
    max_poll_interval: 1
    with:
      states: [["running", 0.2], ["input_required"]]
      prompt: "Approve the plan?"
""",
    "slow.yaml": """\
# A 25-second turn: long enough to lose its worker in the middle.
name: slow
steps:
  - id: work
    provider: scripted
    task: "Work for a while"
    poll_interval: 0.5
    max_poll_interval: 1
    timeout: 120
    with:
      states: [["running", 25], ["completed"]]
      output: "done"
""",
}


@dataclass
class Console:
    """Runs ``orchestration`` commands as a user types them and keeps the transcripts."""

    env: dict[str, str]
    blocks: dict[str, str] = field(default_factory=dict)

    def run(self, command: str, *, expect: tuple[int, ...] = (0,), stderr: bool = False) -> str:
        argv = shlex.split(command)
        env = dict(self.env)
        while re.fullmatch(r"[A-Z_]+=.*", argv[0]):  # VAR=value before the command
            name, _, value = argv.pop(0).partition("=")
            env[name] = value
        assert argv[0] == "orchestration", command
        argv[0] = str(Path(sys.executable).with_name("orchestration"))
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode in expect, f"{command}: exit {done.returncode}\n{done.stderr}"
        text = done.stdout + (done.stderr if stderr else "")
        return "\n".join(line.rstrip() for line in text.splitlines())

    def show(self, name: str, *commands: str, expect: tuple[int, ...] = (0,)) -> str:
        """Run ``commands`` and keep ``$ command`` plus its output as example ``name``."""
        parts = []
        last = ""
        for command in commands:
            last = self.run(command, expect=expect, stderr=True)
            parts.append(f"$ {command}\n{last.rstrip()}")
        self.blocks[name] = "```console\n" + "\n\n".join(parts) + "\n```\n"
        return last

    def keep(self, name: str, text: str, lang: str = "console") -> None:
        self.blocks[name] = f"```{lang}\n{text.rstrip()}\n```\n"


def _clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(COLUMNS="80", NO_COLOR="1", TERM="dumb", PYTHONWARNINGS="ignore")
    env.update(values)
    return env


def _run_id(output: str) -> str:
    match = re.search(r"\brun ([0-9a-f]{32})\b", output)
    assert match, output
    return match[1]


def _poll(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _free_port(preferred: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])


@contextlib.contextmanager
def _broker() -> Iterator[str]:
    url = os.environ.get("ORCH_DOCS_BROKER_URL")
    if url:
        yield url
        return
    from orchestration.runtime.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.url


def _fresh_folder(name: str) -> Path:
    folder = Path(tempfile.gettempdir()) / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _walkthrough(broker_url: str, shell_blocks: dict[str, str]) -> None:
    """docs/getting-started.md and docs/python-api.md: default bounds, a worker and a beat."""
    from orchestration.runtime.processes import ManagedProcess

    folder = _fresh_folder("orchestration-docs")
    exports = {
        "ORCH_DATABASE_URL": f"sqlite:///{folder}/walkthrough.db",
        "ORCH_BROKER_URL": broker_url,
    }
    console = Console(_clean_env(**exports))
    console.keep("walk-env", "\n".join(f"export {k}={v}" for k, v in exports.items()), "bash")
    exe = str(Path(sys.executable).with_name("orchestration"))
    processes: list[ManagedProcess] = []
    try:
        console.keep(
            "walk-workflow",
            (ROOT / "orchestration" / "examples" / "research.yaml").read_text(encoding="utf-8"),
            "yaml",
        )
        console.show("walk-upgrade", "orchestration db upgrade")
        worker_argv = ["worker", "-c", "2"]
        beat_argv = ["beat", "-s", f"{folder}/beat-schedule"]
        console.keep(
            "walk-processes",
            f"orchestration {shlex.join(worker_argv)}    # in a second terminal\n"
            f"orchestration {shlex.join(beat_argv)}    # in a third terminal",
            "bash",
        )
        worker = ManagedProcess([exe, *worker_argv], console.env, folder / "worker.log")
        processes.append(worker)
        beat = ManagedProcess([exe, *beat_argv], console.env, folder / "beat.log")
        processes.append(beat)
        worker.wait_for_log("ready.", timeout=60)
        beat.wait_for_log("beat: Starting", timeout=30)

        out = console.show(
            "walk-launch",
            "orchestration launch orchestration/examples/research.yaml "
            '--args \'{"topic": "octopuses"}\' --wait',
        )
        done = _run_id(out)
        console.show("walk-show", f"orchestration show {done}")
        out = console.show(
            "walk-launch-endless", "orchestration launch orchestration/examples/endless.yaml"
        )
        endless = _run_id(out)
        _poll(
            lambda: (
                json.loads(console.run(f"orchestration show {endless} --json"))["steps"][0]["polls"]
                >= 3
            ),
            30,
            "the endless run polling",
        )
        console.show("walk-runs", "orchestration runs")
        console.show("walk-cancel", f"orchestration cancel {endless}")
        console.show("walk-cancel-ended", f"orchestration cancel {endless}")
        console.show("walk-events", f"orchestration events {endless}")
        console.show(
            "walk-explain", f"orchestration explain {endless}", f"orchestration explain {done}"
        )
        console.show("walk-explain-json", f"orchestration explain {done} --json")
        console.show(
            "walk-errors",
            "orchestration launch orchestration/examples/research.yaml",
            "orchestration show 0123456789abcdef --json",
            expect=(2,),
        )
        console.show(
            "walk-broker-down",
            "ORCH_BROKER_URL=redis://127.0.0.1:1/14 orchestration launch "
            'orchestration/examples/research.yaml --args \'{"topic": "otters"}\'',
            expect=(3,),
        )
        _poll(
            lambda: json.loads(console.run("orchestration health --json", expect=(0, 1)))["ok"],
            60,
            "the sweeper's first pass",
        )
        console.show("walk-health", "orchestration health")
        _flask(console, folder)
    finally:
        for process in sorted(processes, key=lambda p: "beat" not in p.argv):
            process.stop()
    shell_blocks.update(console.blocks)


def _flask(console: Console, folder: Path) -> None:
    """docs/python-api.md: the Flask example against the walkthrough's worker, driven by curl."""
    from orchestration.runtime.processes import ManagedProcess

    port = _free_port(5055)
    base = f"http://127.0.0.1:{port}"
    tokens = "tok-acme=acme,tok-globex=globex"
    console.keep(
        "flask-serve",
        f"FLASK_APP_TOKENS={tokens} flask --app examples/flask_app.py run --port {port}",
        "bash",
    )
    flask = str(Path(sys.executable).with_name("flask"))
    server = ManagedProcess(
        [flask, "--app", "examples/flask_app.py", "run", "--port", str(port)],
        {**console.env, "FLASK_APP_TOKENS": tokens},
        folder / "flask.log",
    )
    transcript: list[str] = []

    def sh(command: str, *, keep: bool = True) -> str:
        done = subprocess.run(
            ["bash", "-c", command],
            env=console.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        if keep:
            transcript.append(f"$ {command}\n{done.stdout.rstrip()}")
        return done.stdout

    acme = "-H 'Authorization: Bearer tok-acme'"
    post = f"curl -s -X POST {acme} -H 'Content-Type: application/json'"
    launch = (
        f"{post} -H 'Idempotency-Key: order-1001' "
        """-d '{"workflow": "research", "args": {"topic": "octopuses"}}' """
        f"{base}/runs"
    )
    try:
        server.wait_for_log("Running on", timeout=30)
        run_id = json.loads(sh(f"{launch} | jq '{{id, status, health}}'"))["id"]
        sh(f"{launch} -o /dev/null -w '%{{http_code}}\\n'")  # the same request again
        _poll(
            lambda: (
                json.loads(sh(f"curl -s {acme} {base}/runs/{run_id}", keep=False))["status"]
                == "completed"
            ),
            60,
            "the Flask-launched run",
        )
        sh(f"curl -s {acme} {base}/runs/{run_id} | jq '{{status, stop_reason, result}}'")
        sh(f"curl -s {acme} {base}/runs/{run_id}/explain | jq -r .text")
        sh(
            f"{post} -H 'Idempotency-Key: order-1001' "
            """-d '{"workflow": "research", "args": {"topic": "squid"}}' """
            f"{base}/runs -w '\\nHTTP %{{http_code}}\\n'"
        )
        sh(f"{post} -d '{{\"workflow\": \"research\"}}' {base}/runs -w '\\nHTTP %{{http_code}}\\n'")
        endless = sh(f"""{post} -d '{{"workflow": "endless"}}' {base}/runs | jq -r .id""").strip()
        _poll(
            lambda: (
                json.loads(sh(f"curl -s {acme} {base}/runs/{endless}", keep=False))["steps"][0][
                    "polls"
                ]
                >= 3
            ),
            30,
            "the endless run polling",
        )
        sh(f"curl -s -X POST {acme} {base}/runs/{endless}/cancel | jq '{{status, stop_reason}}'")
        sh(
            f"curl -s -H 'Authorization: Bearer tok-globex' {base}/runs/{run_id} "
            "-w '\\nHTTP %{http_code}\\n'"
        )
        console.keep("flask-session", "\n\n".join(transcript))
    finally:
        server.stop()


def _explain_examples(broker_url: str, shell_blocks: dict[str, str]) -> None:
    """docs/operations.md: a parked, a stalled and a cancelling run, and the sweeper after."""
    from orchestration.runtime.processes import start_worker
    from orchestration.service import Orchestrator

    folder = _fresh_folder("orchestration-docs-explain")
    for name, body in EXAMPLE_WORKFLOWS.items():
        (folder / name).write_text(body, encoding="utf-8")
    env = _clean_env(
        **EXAMPLE_SETTINGS,
        ORCH_DATABASE_URL=f"sqlite:///{folder}/explain.db",
        ORCH_BROKER_URL=broker_url,
        ORCH_QUEUE="docs-explain",
    )
    console = Console(env)
    settings = Settings.model_validate(
        {k[5:].lower(): v for k, v in env.items() if k.startswith("ORCH_")}
    )
    orch = Orchestrator(settings, None)  # reads only
    console.keep(
        "explain-settings", "\n".join(f"{k}={v}" for k, v in EXAMPLE_SETTINGS.items()), "bash"
    )
    console.keep("explain-workflows", "\n".join(EXAMPLE_WORKFLOWS.values()), "yaml")
    console.run("orchestration db upgrade")

    def record(run_id: str) -> Any:
        return orch.get(run_id, owner=settings.owner)

    workers = []
    try:
        worker = start_worker(env, folder / "worker.log", name="docs", extra=("-Q", "docs-explain"))
        workers.append(worker)
        worker.wait_for_log("ready.", timeout=60)
        launch = f"orchestration launch {folder}/%s --json"
        human = json.loads(console.run(launch % "approval.yaml"))["id"]
        slow = json.loads(console.run(launch % "slow.yaml"))["id"]
        stopping = json.loads(console.run(launch % "slow.yaml"))["id"]
        _poll(lambda: record(human).status == "parked", 30, "the human park")
        console.show("explain-parked", f"orchestration explain {human}")
        _poll(
            lambda: all(record(r).steps[0].polls >= 3 for r in (slow, stopping)),
            30,
            "both slow runs polling",
        )
        worker.signal(signal.SIGKILL)
        worker.proc.wait(10)
        killed = time.monotonic()
        console.show("explain-cancel-graceful", f"orchestration cancel {stopping} --graceful")
        console.show("explain-cancelling", f"orchestration explain {stopping}")
        _poll(lambda: record(slow).health == "stalled", 30, "the stalled run")
        console.show(
            "explain-stalled", f"orchestration explain {slow}", f"orchestration show {slow}"
        )
        console.show("explain-health-no-beat", "orchestration health", expect=(1,))
        assert time.monotonic() - killed < 25, "the slow turn must still be running"
        console.show("explain-sweep", "orchestration sweep")
        console.show(
            "explain-after-sweep",
            f"orchestration explain {slow}",
            f"orchestration explain {stopping}",
        )
        worker = start_worker(
            env, folder / "worker2.log", name="docs2", extra=("-Q", "docs-explain")
        )
        workers.append(worker)
        worker.wait_for_log("ready.", timeout=60)
        _poll(lambda: record(slow).status == "completed", 60, "the re-armed run completing")
        console.show("explain-recovered", f"orchestration explain {slow}")
        console.show(
            "explain-answer",
            f"orchestration answer {human} --step draft --value '\"yes\"'",
        )
        _poll(lambda: record(human).status == "completed", 30, "the answered run")
        console.show("explain-answered", f"orchestration explain {human}")
    finally:
        for process in workers:
            process.stop()
    shell_blocks.update(console.blocks)


@pytest.mark.skipif(not REGENERATE, reason="set ORCH_REGENERATE_DOCS=1 to regenerate examples")
def test_explain_examples() -> None:
    """Run the system and rewrite every ``example`` block in the docs with real output."""
    blocks: dict[str, str] = {}
    with _broker() as broker_url:
        _walkthrough(broker_url, blocks)
        _explain_examples(broker_url, blocks)
    used: set[str] = set()
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        names = set(regions(text, "example"))
        if names:
            path.write_text(replace_regions(text, "example", blocks), encoding="utf-8")
            missing = names - set(blocks)
            assert not missing, f"{path.name}: no generator for examples {sorted(missing)}"
            used |= names
    unused = set(blocks) - used
    assert not unused, f"generated examples that no doc shows: {sorted(unused)}"
