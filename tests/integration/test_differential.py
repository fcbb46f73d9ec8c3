"""The differential test (issue 31): the same workflows played on three deployments, which
must write the same rows, delivery by delivery, and so end every run the same way with the
same journal.

The deployments: a fresh SQLite database (``orchestration.core.pieces`` sends a decision's
statements in sequence), a fresh PostgreSQL database (as one statement of data-modifying
CTEs), and a fresh PostgreSQL database with ``single_statement`` off (in sequence again).
Each workflow is played in-process and deterministically (``tests.support.in_process``):
the step task, the stop task and the sweeper run as a worker and the beat would run them, on
a clock of the test's, and the scripted provider plays the turns. After every delivery and
every action the test records (:class:`Record`) what it came to, every column it changed in
the runs (a fan-out's branch runs too), steps, effects and checkpoints, and the journal rows
it added (``run_events``: step, from, to, cause, stop reason, time since the launch). The
PostgreSQL legs' records must equal the SQLite leg's; a difference fails with a diff. Each
leg must also take the path it claims (:func:`path_problems`) and end its runs as the case
says.

Without ``ORCH_TEST_DATABASE_URL`` only the SQLite leg runs and each test is skipped after it
(with ``CI=true`` the suite refuses to start without PostgreSQL).
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import Engine, make_url

from orchestration.core.db import get_engine, normalize_url, session_scope, upgrade
from orchestration.core.models import (
    Checkpoint,
    Effect,
    InlineOutputBytes,
    LiveRunCount,
    Run,
    RunEvent,
    Step,
)
from orchestration.core.settings import Settings
from orchestration.core.states import RUN_TERMINAL
from orchestration.providers.scripted import ScriptedProvider, store_url
from tests.conftest import DATABASE_URL
from tests.support.in_process import World, age_turns
from tests.support.statements import Sent, sent
from tests.unit.support import FAST, T0, make_settings, step_spec

OWNER = "owner-1"
SQLITE, POSTGRESQL, SEQUENCED = "sqlite", "postgresql", "postgresql, single statements off"
LEGS = (SQLITE, POSTGRESQL, SEQUENCED)
NO_POSTGRESQL = (
    "the PostgreSQL legs need ORCH_TEST_DATABASE_URL: only the SQLite leg ran "
    "(with CI=true the suite refuses to start without it)"
)
#: The deliveries a difference shows at most.
SHOWN = 12
#: Seconds a scripted state lasts unless the test ages the turn.
LONG = 30.0
INSTANT = {"states": [["completed"]]}
RUNNING = {"states": [["running", LONG], ["completed"]]}
#: How a run ended: its status, its stop reason, and its steps' statuses.
Ended = tuple[str, str | None, tuple[str, ...]]


# -- the deployments -----------------------------------------------------------------------


@dataclass(frozen=True)
class Templates:
    """Migrated databases each leg copies: a SQLite file and, with ``ORCH_TEST_DATABASE_URL``,
    a PostgreSQL database (copied with ``CREATE DATABASE … TEMPLATE``), with the connection
    that copies and drops them. A leg's database is dropped in ``drops`` while the next
    leg plays: a drop waits for the server's disk, which the legs' writes hardly do."""

    sqlite: Path
    postgresql: str | None = None
    admin: Engine | None = None
    drops: ThreadPoolExecutor | None = None
    dropping: list[Future[None]] = field(default_factory=list)


def _postgresql_url(name: str) -> str:
    assert DATABASE_URL is not None
    url = make_url(normalize_url(DATABASE_URL)).set(database=name)
    return url.render_as_string(hide_password=False)


def _execute(admin: Engine, statement: str) -> None:
    with admin.connect() as connection:
        connection.execute(text(statement))


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Templates]:
    template = make_settings(tmp_path_factory.mktemp("differential"), name="template")
    upgrade(template.database_url)
    get_engine(template.database_url).dispose()  # checkpoints the WAL: a plain copy is whole
    sqlite = Path(make_url(template.database_url).database or "")
    if not DATABASE_URL:
        yield Templates(sqlite)
        return
    name = f"orch_differential_{uuid.uuid4().hex[:8]}"
    admin = create_engine(normalize_url(DATABASE_URL), isolation_level="AUTOCOMMIT")
    _execute(admin, f'CREATE DATABASE "{name}"')
    try:
        settings = Settings(database_url=_postgresql_url(name), broker_url="memory://")
        upgrade(settings.database_url)
        ScriptedProvider(settings)  # its tables
        get_engine(settings.database_url).dispose()  # a template is copied only unconnected
        with ThreadPoolExecutor(max_workers=1) as drops:
            built = Templates(sqlite, name, admin, drops)
            yield built
        for dropped in built.dropping:
            dropped.result()
    finally:
        _execute(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def deployed(templates: Templates, leg: str, folder: Path) -> Iterator[Settings]:
    """Settings on a fresh migrated database of ``leg``, dropped afterwards."""
    if leg == SQLITE:
        settings = make_settings(folder, name="sqlite")
        shutil.copyfile(templates.sqlite, make_url(settings.database_url).database or "")
        try:
            yield settings
        finally:
            for url in (settings.database_url, store_url(settings)):
                get_engine(url).dispose()
        return
    admin, drops = templates.admin, templates.drops
    assert templates.postgresql is not None and admin is not None and drops is not None
    name = f"orch_differential_{uuid.uuid4().hex[:8]}"
    _execute(admin, f'CREATE DATABASE "{name}" TEMPLATE "{templates.postgresql}"')
    settings = Settings(
        database_url=_postgresql_url(name),
        broker_url="memory://",
        single_statement=leg == POSTGRESQL,
        **FAST,
    )
    try:
        yield settings
    finally:
        get_engine(settings.database_url).dispose()
        drop = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
        templates.dropping.append(drops.submit(_execute, admin, drop))


# -- what is compared ----------------------------------------------------------------------

#: The columns that name a row of each table (besides its run), in its name.
_NAMED_BY = {
    "run": (),
    "step": ("index", "step_id"),
    "effect": ("step_index", "attempt", "kind"),
    "checkpoint": ("step_index", "attempt"),
}
#: Columns that are keys of a database's own (the row's name stands for them).
_KEYS = {"id", "pk", "run_id"}
#: Columns named like ids: a hash of the request, a rerun's source run id among it.
_HASHED = {"fingerprint"}
_HEX_ID = re.compile(r"\b[0-9a-f]{32}\b")


def _seconds(at: datetime) -> str:
    return f"{(at - T0).total_seconds():+.3f}s"


class Record:
    """What a leg wrote, delivery by delivery (a :data:`in_process.Observer`): after each
    delivery or action, what it came to, the columns of runs, steps, effects and checkpoints
    that it changed, the journal rows it added (``run_events``) and the live runs' counts.

    Values are written as the three legs can share them: a run id as the run's name (its
    request id; a branch run's is its parent's, step and branch), any other id (a task's) by
    the order it was first seen in, a provider's turn id by its key, a time as seconds since
    the launch, JSON with its keys sorted (PostgreSQL's ``jsonb`` keeps its own order)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: Per delivery or action: what it came to, then what it wrote.
        self.deliveries: list[list[str]] = []
        self._state: dict[str, str] = {}
        self._journaled = 0
        self._runs: dict[str, str] = {}
        self._others: dict[str, str] = {}
        #: Each run as the last delivery left it.
        self.ended: dict[str, Ended] = {}

    def __call__(self, when: datetime, what: str, outcome: object) -> None:
        state, events = self._read()
        lines = [f"{_seconds(when)} {self._named(what)}: {self._named(repr(outcome))}"]
        lines += [
            f"    {key} = {value}" for key, value in state.items() if self._state.get(key) != value
        ]
        lines += [f"    {key} is gone" for key in self._state if key not in state]
        lines += [
            f"    journal {_seconds(event['at'])} {self._runs[event['run_id']]} "
            f"{event['step_id'] or 'run'}: {event['from_status']} -> {event['to_status']} "
            f"cause={self._value(event['cause'])} stop_reason={event['stop_reason']}"
            for event in events
        ]
        self.deliveries.append(lines)
        self._state = state

    def _read(self) -> tuple[dict[str, str], list[Any]]:
        tables = {
            "run": (Run.__table__, Run.created_at),
            "step": (Step.__table__, Step.index),
            "effect": (Effect.__table__, Effect.pk),
            "checkpoint": (Checkpoint.__table__, Checkpoint.pk),
        }
        with session_scope(self.settings.database_url) as session:
            rows = {
                kind: session.execute(select(table).order_by(order)).mappings().all()
                for kind, (table, order) in tables.items()
            }
            journal = select(RunEvent.__table__).order_by(RunEvent.id).offset(self._journaled)
            events = session.execute(journal).mappings().all()
            # The sums: PostgreSQL spreads a count over slots of its own choosing.
            live = session.execute(
                select(LiveRunCount.owner, func.sum(LiveRunCount.live))
                .group_by(LiveRunCount.owner)
                .order_by(LiveRunCount.owner)
            ).all()
            inline = session.execute(
                select(InlineOutputBytes.owner, func.sum(InlineOutputBytes.bytes))
                .group_by(InlineOutputBytes.owner)
                .order_by(InlineOutputBytes.owner)
            ).all()
        self._journaled += len(events)
        self._name_runs(rows["run"])
        state: dict[str, str] = {}
        for kind, found in rows.items():
            for row in found:
                run = self._runs[row["id"] if kind == "run" else row["run_id"]]
                name = " ".join([run, kind, *(str(row[key]) for key in _NAMED_BY[kind])])
                for key, value in row.items():
                    if key in _HASHED:
                        state[f"{name}: {key}"] = self._named_id(str(value))
                    elif key not in _KEYS:
                        state[f"{name}: {key}"] = self._value(value)
        state.update({f"live runs of {owner}": str(count) for owner, count in live})
        state.update({f"inline output bytes of {owner}": str(count) for owner, count in inline})
        self.ended = {
            self._runs[run["id"]]: (
                run["status"],
                run["stop_reason"],
                tuple(step["status"] for step in rows["step"] if step["run_id"] == run["id"]),
            )
            for run in rows["run"]
        }
        return dict(sorted(state.items())), list(events)

    def _name_runs(self, runs: Sequence[Any]) -> None:
        by_id = {run["id"]: run for run in runs}

        def name(run_id: str) -> str:
            run = by_id[run_id]
            if run["parent_run_id"] is None:
                return str(run["request_id"])
            return f"{name(run['parent_run_id'])}/{run['parent_step']}.{run['branch']}"

        self._runs = {run_id: name(run_id) for run_id in by_id}
        assert len(set(self._runs.values())) == len(self._runs), self._runs

    def _value(self, value: object) -> str:
        if isinstance(value, datetime):
            return _seconds(value)
        return self._named(json.dumps(value, sort_keys=True, default=str))

    def _named(self, said: str) -> str:
        named = _HEX_ID.sub(lambda found: self._named_id(found.group()), said)
        return re.sub(r"scripted-[0-9a-f]{20}", "scripted-<turn>", named)

    def _named_id(self, key: str) -> str:
        if key in self._runs:
            return f"<{self._runs[key]}>"
        return self._others.setdefault(key, f"<id {len(self._others)}>")


#: A CTE's head: ``name AS (UPDATE …``.
_CTE = re.compile(r"\b(\w+) AS\s*\(\s*(?:UPDATE|INSERT|DELETE|SELECT)\b", re.IGNORECASE)
#: What ``pieces`` adds to the pieces it sends together: per piece, whether it returned a
#: row (``EXISTS (SELECT 1 FROM name) AS name__``).
_RETURNED = re.compile(r"\bAS (\w+?)__(?:,|\s|$)")


def together(seen: Sent) -> list[tuple[str, ...]]:
    """The CTEs of each statement sent as one statement of several CTEs."""
    heads = ((sql, _CTE.findall(sql)) for sql, _ in seen.texts if sql.lstrip()[:4] == "WITH")
    return [tuple(names) for _, names in heads if len(names) > 1]


def pieces_together(seen: Sent) -> list[tuple[str, ...]]:
    """The pieces of each decision ``orchestration.core.pieces`` sent as one statement."""
    sent_whole = (_RETURNED.findall(sql) for sql, _ in seen.texts if sql.lstrip()[:4] == "WITH")
    return [tuple(names) for names in sent_whole if len(names) > 1]


def path_problems(leg: str, seen: Sent) -> list[str]:
    """How the leg's statements contradict the path it claims: with single statements on,
    decisions went as one statement of CTEs; otherwise no statement of several CTEs went."""
    if leg == POSTGRESQL:
        if not pieces_together(seen):
            return [f"{leg}: no decision's pieces were sent as one statement"]
        return []
    if found := together(seen):
        return [f"{leg}: statements of several CTEs were sent, of {sorted(set(found))}"]
    return []


# -- the cases -----------------------------------------------------------------------------

Script = Callable[[World, str], None]


def played_out(world: World, run_id: str) -> None:
    """Every task delivered until the runs end (or wait for a person)."""
    world.play()


def _executed(world: World, run_id: str, index: int, times: int) -> Callable[[], bool]:
    return lambda: world.executions[run_id, index] >= times


def polled_to_idle(world: World, run_id: str) -> None:
    """The turn starts and is polled twice while it runs; then it settles at ``idle``."""
    world.play(until=_executed(world, run_id, 0, 3))
    age_turns(world.settings, LONG)
    world.play()


def redelivered(world: World, run_id: str) -> None:
    """Every step task is delivered twice."""
    world.redeliver = True
    polled_to_idle(world, run_id)


def _branches_polled(world: World, run_id: str, branches: int) -> Callable[[], bool]:
    """Whether the first ``branches`` branch runs to start have each been executed twice."""

    def polled() -> bool:
        counts = [n for (run, _), n in world.executions.items() if run != run_id]
        return len(counts) >= branches and min(counts[:branches]) >= 2

    return polled


def fanned_out(world: World, run_id: str) -> None:
    """Two branches run at once while the third waits for a slot; they finish, the third
    runs, and the step joins."""
    world.play(until=_branches_polled(world, run_id, 2))
    age_turns(world.settings, LONG)
    world.play(until=_branches_polled(world, run_id, 3))
    age_turns(world.settings, LONG)
    world.play()


def rerun(world: World, run_id: str) -> None:
    """The run fails; a rerun reuses what completed and runs the rest."""
    world.play()
    world.wait(5)
    world.act("rerun", lambda: world.orch.rerun(run_id, owner=OWNER, request_id="rerun"))
    world.play()


def cancelled_fan_out(world: World, run_id: str) -> None:
    """Two branches run and the third waits for a slot when the parent is cancelled."""
    world.play(until=_branches_polled(world, run_id, 2))
    world.act("cancel", lambda: world.orch.cancel(run_id, owner=OWNER))
    world.play()


def timed_out(world: World, run_id: str) -> None:
    """The turn runs past the step's timeout; the step's next execution ends the run."""
    world.play(until=_executed(world, run_id, 0, 2))
    world.wait(10)
    world.play()


def lost(world: World, run_id: str) -> None:
    """The worker dies with the step's message while its turn runs: the heartbeat goes
    stale, the sweeper sends the step again, and the turn, still running, is polled on."""
    world.play(until=_executed(world, run_id, 0, 2))
    world.lose()
    world.wait(15)
    age_turns(world.settings, LONG)
    world.play()


def answered(world: World, run_id: str) -> None:
    """The turn asks for input; five seconds later a person answers."""
    world.play()
    world.wait(5)
    world.act("answer", lambda: world.orch.answer(run_id, "ask", {"pick": 2}, owner=OWNER))
    world.play()


def decided(approve: bool) -> Script:
    """The approval waits; five seconds later a person approves it, or rejects it."""

    def decide(world: World, run_id: str) -> None:
        world.play()
        world.wait(5)
        world.act(
            "approve" if approve else "reject",
            lambda: world.orch.approve(
                run_id, "review", owner=OWNER, approve=approve, comment="read it"
            ),
        )
        world.play()

    return decide


def cancelled(graceful: bool) -> Script:
    """The turn starts and is polled twice; the run is cancelled while it runs."""

    def cancel(world: World, run_id: str) -> None:
        world.play(until=_executed(world, run_id, 0, 3))
        world.wait(0.05)
        world.act("cancel", lambda: world.orch.cancel(run_id, owner=OWNER, graceful=graceful))
        world.play()

    return cancel


@dataclass(frozen=True)
class Case:
    """A workflow, how the test plays it after the launch, and how its runs must end (run
    name: status, stop reason, each step's status), checked on every leg."""

    name: str
    flow: dict[str, Any]
    ends: Mapping[str, Ended]
    script: Script = played_out
    args: dict[str, Any] | None = None


def _flow(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "differential", "steps": list(steps)}


def _approval() -> dict[str, Any]:
    return _flow(
        {"id": "review", "approval": {"prompt": "Publish {{ args.title }}?", "expires_in": 60}},
        step_spec("publish", task="{{ steps.review.output.decision }}", with_=INSTANT),
    )


def _fan_out() -> dict[str, Any]:
    """Three branches, two at a time, then a step that reads their outputs."""
    return _flow(
        {
            "id": "research",
            "for_each": "{{ args.topics }}",
            "max_concurrency": 2,
            "step": {
                "provider": "scripted",
                "task": "Research {{ item }} ({{ index }})",
                "poll_interval": 0.1,
                "max_poll_interval": 1.0,
                "with": RUNNING,
            },
        },
        step_spec("summary", task="{{ steps.research.output }}", with_=INSTANT),
    )


CASES = [
    Case(
        "instant steps",
        _flow(*(step_spec(name, task=f"do {name}", with_=INSTANT) for name in "abc")),
        ends={"run": ("completed", "completed", ("completed",) * 3)},
    ),
    Case(
        "polls that end idle",
        _flow(
            step_spec("work", with_={"states": [["running", LONG], ["idle"]]}),
            step_spec("after", task="{{ steps.work.output }} again", with_=INSTANT),
        ),
        script=polled_to_idle,
        ends={"run": ("completed", "completed", ("completed", "completed"))},
    ),
    Case(
        "every delivery twice",
        _flow(
            step_spec("work", with_={"states": [["running", LONG], ["idle"]]}),
            step_spec("after", with_=INSTANT),
        ),
        ends={"run": ("completed", "completed", ("completed", "completed"))},
        script=redelivered,
    ),
    Case(
        "a failure",
        _flow(
            step_spec("a", with_=INSTANT),
            step_spec("b", with_={"states": [["failed"]], "error": "the model refused"}),
            step_spec("c", with_=INSTANT),
        ),
        ends={"run": ("failed", "step_failed", ("completed", "failed", "skipped"))},
    ),
    Case(
        "a retry",
        _flow(
            step_spec(
                "flaky",
                with_={"attempt_states": [[["failed"]], [["failed"]]], "states": [["completed"]]},
                retry={"attempts": 3, "backoff": 2, "max_backoff": 60},
            ),
            step_spec("after", with_=INSTANT),
        ),
        ends={"run": ("completed", "completed", ("completed", "completed"))},
    ),
    Case(
        "a human answer",
        _flow(
            step_spec("ask", with_={"states": [["input_required"]], "prompt": "which one?"}),
            step_spec("use", task="{{ steps.ask.output.pick }}", with_=INSTANT),
        ),
        script=answered,
        ends={"run": ("completed", "completed", ("completed", "completed"))},
    ),
    Case(
        "an approval, approved",
        _approval(),
        script=decided(approve=True),
        ends={"run": ("completed", "completed", ("completed", "completed"))},
        args={"title": "the report"},
    ),
    Case(
        "an approval, rejected",
        _approval(),
        script=decided(approve=False),
        ends={"run": ("failed", "approval_rejected", ("failed", "skipped"))},
        args={"title": "the report"},
    ),
    Case(
        "a fan-out",
        _fan_out(),
        script=fanned_out,
        ends={
            "run": ("completed", "completed", ("completed", "completed")),
            **{
                f"run/0.{branch}": ("completed", "completed", ("completed",))
                for branch in (0, 1, 2)
            },
        },
        args={"topics": ["ants", "bees", "cats"]},
    ),
    Case(
        "a cancel of a fan-out",
        _fan_out(),
        ends={
            "run": ("cancelled", "cancel_requested", ("cancelled", "cancelled")),
            **{
                f"run/0.{branch}": ("cancelled", "parent_ended", ("cancelled",))
                for branch in (0, 1, 2)
            },
        },
        script=cancelled_fan_out,
        args={"topics": ["ants", "bees", "cats"]},
    ),
    Case(
        "a rerun that reuses a branch",
        _flow(
            {
                "id": "drafts",
                "parallel": {
                    "join": "all_settled",
                    "steps": [
                        step_spec("short", with_=INSTANT),
                        step_spec("bad", with_={"states": [["failed"]]}),
                    ],
                },
            }
        ),
        ends={
            name: ("failed", "step_failed", ("failed",))
            for name in ("run", "run/0.1", "rerun", "rerun/0.1")
        }
        | {name: ("completed", "completed", ("completed",)) for name in ("run/0.0", "rerun/0.0")},
        script=rerun,
    ),
    Case(
        "a step timeout",
        _flow(step_spec("slow", with_=RUNNING, timeout=5)),
        ends={"run": ("timed_out", "step_timeout", ("timed_out",))},
        script=timed_out,
    ),
    Case(
        "a message lost with its worker",
        _flow(step_spec("work", with_=RUNNING), step_spec("after", with_=INSTANT)),
        ends={"run": ("completed", "completed", ("completed", "completed"))},
        script=lost,
    ),
    Case(
        "a cancel mid-turn",
        _flow(step_spec("a", with_=RUNNING), step_spec("b", with_=INSTANT)),
        script=cancelled(graceful=False),
        ends={"run": ("cancelled", "cancel_requested", ("cancelled", "cancelled"))},
    ),
    Case(
        "a graceful cancel mid-turn",
        _flow(step_spec("a", with_=RUNNING), step_spec("b", with_=INSTANT)),
        script=cancelled(graceful=True),
        ends={"run": ("cancelled", "cancel_requested", ("cancelled", "cancelled"))},
    ),
]


def ends_problems(leg: str, case: Case, ended: dict[str, Ended]) -> list[str]:
    """How the leg's runs ended otherwise than the case says."""
    live = [name for name, (status, _, _) in ended.items() if status not in RUN_TERMINAL]
    problems = [f"{leg}: runs still live: {live}"] if live else []
    if ended != case.ends:
        problems.append(f"{leg}: the runs ended {ended}, not {case.ends}")
    return problems


def differences(reference: list[list[str]], other: list[list[str]], leg: str) -> list[str]:
    """Where the record of ``leg`` differs from the SQLite leg's, delivery by delivery."""
    shown = []
    none: list[str] = []
    for n, (mine, theirs) in enumerate(itertools.zip_longest(reference, other, fillvalue=none)):
        if mine != theirs:
            changed = [line for line in difflib.ndiff(mine, theirs) if line[:1] in "-+"]
            shown.append(f"  delivery {n}, {(mine or theirs)[0]}\n" + "\n".join(changed))
    if not shown:
        return []
    heading = (
        f"{leg} differs from {SQLITE} ('-' {SQLITE}, '+' {leg}) in {len(shown)} of the "
        f"deliveries and actions ({len(reference)} on {SQLITE}, {len(other)} on {leg}):"
    )
    more = [f"  … and {len(shown) - SHOWN} more"] if len(shown) > SHOWN else []
    return [heading + "\n" + "\n".join(shown[:SHOWN] + more)]


def play(
    case: Case, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[str]], dict[str, Ended], Sent]:
    """The case played on the deployment of ``settings``: its record, how its runs ended,
    and what it sent."""
    record = Record(settings)
    world = World(settings, monkeypatch, record)
    with sent(settings) as seen:
        run_id = world.act(
            "launch",
            lambda: world.orch.launch(case.flow, case.args, owner=OWNER, request_id="run").id,
        )
        case.script(world, run_id)
    return record.deliveries, record.ended, seen


@pytest.mark.parametrize("case", CASES, ids=[case.name.replace(" ", "-") for case in CASES])
def test_the_three_deployments_agree(
    case: Case, templates: Templates, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    legs = LEGS if templates.postgresql is not None else (SQLITE,)
    played: dict[str, list[list[str]]] = {}
    problems: list[str] = []
    for leg in legs:
        with deployed(templates, leg, tmp_path) as settings:
            played[leg], ended, seen = play(case, settings, monkeypatch)
            problems += path_problems(leg, seen)
            problems += ends_problems(leg, case, ended)
    for leg in legs[1:]:
        problems += differences(played[SQLITE], played[leg], leg)
    assert not problems, "\n\n".join(problems)
    if templates.postgresql is None:
        pytest.skip(NO_POSTGRESQL)
