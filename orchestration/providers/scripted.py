"""The scripted provider: a deterministic agent simulator for demos, tests and rehearsals.

A turn plays ``states``, a list of ``[status, seconds]`` pairs, from the moment it started;
the last pair is held forever. Turns live in a small table of their own (``scripted_turns``),
so every worker process sees the same turn, and ``start`` is idempotent per key the way a real
runtime's idempotency key is. A cancel tombstones the key: a start that arrives after it
returns the cancelled turn instead of starting a new one; a cancel that lands after the turn
ended leaves its end. A start that arrives after its request's ``deadline`` (on the store's
clock) begins nothing and answers as an outage.

Every ``start`` call is also journaled (``scripted_start_calls``: the key, when the call
arrived on the provider's own clock, and what it did), like a real runtime's access log. A turn row
cannot show a second start of the same key, nor a start that hit a tombstone after a cancel;
the journal does, so the chaos audit and the tests count what the provider saw, not what the
engine stored.

Options (``with:``):

* ``states``: e.g. ``[["running", 0.5], ["idle"]]`` (default ``[["running", 1], ["completed"]]``)
* ``output``: the answer of a finished turn (default: the step's rendered task)
* ``error``: the error text of a ``failed`` turn
* ``prompt``: what an ``input_required`` turn asks
* ``reset_after``: seconds until a ``rate_limited`` turn may resume (default: that state's
  duration)
* ``cancel_delay``: seconds a cancel takes to land (default 0)
* ``resume_states`` / ``resume_output``: the script of a turn that resumes a human park
  (default ``[["completed"]]``, answering with the human's value)
* ``poll_delay``: seconds each status call blocks, to rehearse a slow runtime (a delay longer
  than ``ORCH_PROVIDER_TIMEOUT`` is reported as an outage after the timeout)
* ``checkpoint_fails``: ``true`` makes the checkpoint capture fail, to rehearse effects that
  exhaust their attempts
* ``attempt_states``: a script per attempt of the step, e.g. ``[[["failed"]], [["failed"]]]``
  makes the first two attempts fail; later attempts play ``states`` (to rehearse ``retry``)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    ColumnElement,
    Connection,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from orchestration.core import pieces
from orchestration.core.db import (
    get_engine,
    insert_spelled,
    normalize_url,
    session_scope,
    utcnow,
)
from orchestration.core.errors import RetryableProviderError
from orchestration.core.models import UTCDateTime
from orchestration.core.settings import Settings
from orchestration.providers import scripted_options
from orchestration.providers.base import (
    ENDED,
    Evidence,
    ProviderStatus,
    TurnRef,
    TurnRequest,
    TurnStatus,
)
from orchestration.providers.base import JSON as JSONValue

_META = MetaData()
TURNS = Table(
    "scripted_turns",
    _META,
    Column("key", String(200), primary_key=True),
    Column("provider_run_id", String(64), nullable=False),
    Column("options", JSON, nullable=False),
    Column("input", JSON),
    Column("resume", JSON),
    Column("resuming", Boolean, nullable=False, default=False),
    Column("started_at", UTCDateTime()),
    Column("cancel_requested_at", UTCDateTime()),
    Column("start_calls", Integer, nullable=False, default=0),
)

#: What a ``start`` call did: began the turn, found it already begun, found the tombstone a
#: cancel left, or arrived after the request's deadline (the last two began nothing).
STARTED, EXISTING, TOMBSTONE, EXPIRED = "started", "existing", "tombstone", "expired"

START_CALLS = Table(
    "scripted_start_calls",
    _META,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(200), nullable=False),
    Column("called_at", UTCDateTime(), nullable=False),
    Column("outcome", String(16), nullable=False),
    Index("ix_scripted_start_calls_key", "key"),
)

_TURN = select(TURNS).where(TURNS.c.key == bindparam("key"))

_DEFAULT_STATES: list[list[Any]] = [["running", 1], ["completed"]]
_DEFAULT_RESUME_STATES: list[list[Any]] = [["completed"]]


def store_url(settings: Settings) -> str:
    """Where turns are kept: ``ORCH_SCRIPTED_URL``, else beside the engine's database.

    On SQLite a sibling file is used: the engine holds the database's write lock while it
    starts a turn (so that a cancel cannot slip between claim and start), and the simulator
    must not wait on that same lock.
    """
    if settings.scripted_url:
        return settings.scripted_url
    url = make_url(normalize_url(settings.database_url))
    if url.drivername.startswith("sqlite") and url.database not in (None, "", ":memory:"):
        database = str(url.database)
        stem = database[:-3] if database.endswith(".db") else database
        return url.set(database=f"{stem}.scripted.db").render_as_string(hide_password=False)
    return settings.database_url


def _play(states: list[list[Any]], elapsed: float) -> tuple[str, float]:
    """The status at ``elapsed`` seconds, and when (seconds from start) that state began."""
    began = 0.0
    for entry in states[:-1]:
        if elapsed < began + float(entry[1]):
            return str(entry[0]), began
        began += float(entry[1])
    return str(states[-1][0]), began


class ScriptedProvider:
    """See the module docstring."""

    name = "scripted"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._url = store_url(settings)
        try:
            _META.create_all(get_engine(self._url), checkfirst=True)
        except DBAPIError:
            # Another process created the tables between the check and the create (PostgreSQL
            # reports a duplicate type); they exist now, which is all that is needed. One
            # transaction creates both, so either both are there or neither is.
            _META.create_all(get_engine(self._url), checkfirst=True)

    def validate(self, options: Mapping[str, Any]) -> None:
        scripted_options.check(options)

    def describe(self, options: Mapping[str, Any]) -> Evidence | None:
        """What the step's ``evidence`` option says the simulated agent is; ``None``: the
        step simulates an agent that says nothing of itself."""
        said = options.get("evidence")
        if said is None:
            return None
        return Evidence(name=said.get("name"), version=said.get("version"))

    def start(self, request: TurnRequest) -> str:
        run_id = "scripted-" + hashlib.sha256(request.key.encode()).hexdigest()[:20]
        options = dict(request.options)
        scripts = options.get("attempt_states", [])
        if request.attempt <= len(scripts):  # this attempt plays its own script
            options["states"] = scripts[request.attempt - 1]
        values = {
            "key": request.key,
            "provider_run_id": run_id,
            "options": options,
            "input": request.input,
            "resume": request.resume,
            "resuming": request.resuming,
        }
        params: dict[str, Any] = {f"t_{name}": values[name] for name in _STARTED_COLUMNS}
        params.update(t_deadline=request.deadline, t_arrived=utcnow())
        engine = get_engine(self._url)
        dialect = engine.dialect.name
        deadlined = request.deadline is not None
        with _store(engine) as connection:
            began = pieces.send(connection, _beginning(dialect, deadlined), params)["began"]
            connection.commit()
        if began is not None:
            return run_id
        # Nothing began: the key exists (begun, or tombstoned by a cancel), or the call came
        # too late. The call is counted on the turn only when it came in time, and journaled.
        with engine.begin() as connection:
            again = connection.execute(_again(dialect, deadlined), params).first()
            if again is None:
                outcome = EXPIRED
            else:
                outcome = TOMBSTONE if again.started_at is None else EXISTING
            called = {**params, "t_outcome": outcome}
            arrived = connection.execute(_called(dialect), called).scalar_one()
        if outcome == EXPIRED:
            assert request.deadline is not None
            late = (arrived - request.deadline).total_seconds()
            raise RetryableProviderError(
                f"scripted: the start arrived {late:.3f}s after its deadline; no turn began"
            )
        return run_id

    def _row(self, key: str) -> Any:
        # One statement, no transaction around it: a status read is what a runtime's GET is.
        with get_engine(self._url).connect() as connection:
            return (
                connection.execution_options(isolation_level="AUTOCOMMIT")
                .execute(_TURN, {"key": key})
                .one_or_none()
            )

    def status(self, ref: TurnRef) -> TurnStatus:
        delay = float(ref.options.get("poll_delay", 0) or 0)
        if delay:
            time.sleep(min(delay, self._settings.provider_timeout))
            if delay > self._settings.provider_timeout:
                raise RetryableProviderError(
                    f"scripted: status call timed out after {self._settings.provider_timeout}s"
                )
        row = self._row(ref.key)
        if row is None:
            return TurnStatus(ProviderStatus.PENDING, raw="pending")
        now = utcnow()
        options = row.options
        if row.resuming:
            states = options.get("resume_states", _DEFAULT_RESUME_STATES)
        else:
            states = options.get("states", _DEFAULT_STATES)
        if row.started_at is None:  # a tombstone: the cancel came before any start
            return TurnStatus(ProviderStatus.CANCELLED, raw="cancelled")
        if row.cancel_requested_at is not None:
            landed = row.cancel_requested_at + timedelta(
                seconds=float(options.get("cancel_delay", 0) or 0)
            )
            # A cancel that lands on a turn already ended stops nothing: the turn keeps its
            # end, as a real runtime's does.
            ended = _play(states, (landed - row.started_at).total_seconds())[0] in ENDED
            if now >= landed and not ended:
                return TurnStatus(ProviderStatus.CANCELLED, raw="cancelled")
        elapsed = (now - row.started_at).total_seconds()
        word, began = _play(states, elapsed)
        status = ProviderStatus(word)
        if status in (ProviderStatus.COMPLETED, ProviderStatus.IDLE):
            if row.resuming:
                output = options.get("resume_output", row.resume)
            else:
                output = options.get("output", row.input)
            return TurnStatus(status, raw=word, output=output)
        if status is ProviderStatus.FAILED:
            return TurnStatus(status, raw=word, error=str(options.get("error", "scripted failure")))
        if status is ProviderStatus.INPUT_REQUIRED:
            return TurnStatus(status, raw=word, prompt=options.get("prompt", "input required"))
        if status is ProviderStatus.RATE_LIMITED:
            reset_after = options.get("reset_after")
            reset_at = _reset_at(row.started_at, began, reset_after, states, elapsed)
            return TurnStatus(status, raw=word, reset_at=reset_at)
        return TurnStatus(status, raw=word)

    def cancel(self, ref: TurnRef) -> None:
        now = utcnow()
        with session_scope(self._url) as session:
            done = session.execute(
                update(TURNS)
                .where(TURNS.c.key == ref.key, TURNS.c.cancel_requested_at.is_(None))
                .values(cancel_requested_at=now)
            )
            if done.rowcount == 0 and self._row_missing(session, ref.key):  # type: ignore[attr-defined]
                # Tombstone: a start that arrives after this cancel must not begin a turn.
                session.execute(
                    TURNS.insert().values(
                        key=ref.key,
                        provider_run_id="scripted-cancelled",
                        options=dict(ref.options),
                        resuming=False,
                        started_at=None,
                        cancel_requested_at=now,
                        start_calls=0,
                    )
                )

    @staticmethod
    def _row_missing(session: Any, key: str) -> bool:
        return session.execute(select(TURNS.c.key).where(TURNS.c.key == key)).first() is None

    def snapshot(self, ref: TurnRef) -> JSONValue:
        if ref.options.get("checkpoint_fails"):
            raise RetryableProviderError("scripted: checkpoint capture failed (checkpoint_fails)")
        observed = self.status(ref)
        return {"status": observed.raw, "output": observed.output}

    def turns(self, key_prefix: str) -> list[dict[str, Any]]:
        """Every turn whose key starts with ``key_prefix`` (``run_id:`` for one run): how tests
        and rehearsals count the turns a run really started."""
        with session_scope(self._url) as session:
            rows = session.execute(
                select(TURNS).where(TURNS.c.key.startswith(key_prefix, autoescape=True))
            ).all()
        return [dict(row._mapping) for row in rows]

    def start_calls(self, key_prefix: str) -> list[dict[str, Any]]:
        """Every ``start`` call on a key that starts with ``key_prefix``, in the order the
        provider journaled them (``key``, ``called_at``, ``outcome``): what the provider saw,
        so a repeated start, or a start after a cancel, shows though it began no second turn."""
        with session_scope(self._url) as session:
            rows = session.execute(
                select(START_CALLS.c.key, START_CALLS.c.called_at, START_CALLS.c.outcome)
                .where(START_CALLS.c.key.startswith(key_prefix, autoescape=True))
                .order_by(START_CALLS.c.id)
            ).all()
        return [dict(row._mapping) for row in rows]


#: The columns a start writes, bound as ``t_<column>``.
_STARTED_COLUMNS = ("key", "provider_run_id", "options", "input", "resume", "resuming")


def _arrived(dialect: str) -> ColumnElement[datetime]:
    """When the call reached the store, on the store's clock where it has one (PostgreSQL's
    ``statement_timestamp()``; SQLite has none, and takes the caller's, ``t_arrived``): a
    runtime judges a deadline by when a request arrived, not by when it was sent."""
    if dialect == "postgresql":
        return func.statement_timestamp()
    return bindparam("t_arrived", type_=UTCDateTime())


def _in_time(dialect: str, deadlined: bool) -> ColumnElement[bool]:
    """The call arrived by its request's deadline (``t_deadline``), or had none."""
    if not deadlined:
        return true()
    return _arrived(dialect) <= bindparam("t_deadline", type_=UTCDateTime())


@functools.lru_cache(maxsize=4)
def _beginning(dialect: str, deadlined: bool) -> tuple[pieces.Piece, pieces.Piece]:
    """A start that begins a turn, as pieces: the turn's insert, made only for a new key and
    a call in time, and its call's journal row, written only when the turn was (on
    PostgreSQL one statement in autocommit, as one request to a runtime is one round trip)."""
    arrived = _arrived(dialect)
    given = [bindparam(f"t_{name}", type_=TURNS.c[name].type) for name in _STARTED_COLUMNS]
    began = (
        insert_spelled(dialect, TURNS)
        .from_select(
            [*_STARTED_COLUMNS, "start_calls", "started_at"],
            # SQLite parses an upsert's SELECT only with a WHERE of its own.
            select(*given, literal(1), arrived).where(_in_time(dialect, deadlined)),
        )
        .on_conflict_do_nothing(index_elements=[TURNS.c.key])
        .returning(TURNS.c.key)
    )
    call = START_CALLS.insert().returning(START_CALLS.c.key)
    row = select(given[0], arrived, literal(STARTED))
    return (
        pieces.Piece("began", began),
        pieces.Piece("call", call, after="began", source=(("key", "called_at", "outcome"), row)),
    )


@functools.lru_cache(maxsize=4)
def _again(dialect: str, deadlined: bool) -> Any:
    """A call for a key that exists, counted on its turn when it came in time; it returns
    the turn's ``started_at`` (``NULL``: a cancel's tombstone)."""
    return (
        update(TURNS)
        .where(TURNS.c.key == bindparam("t_key"), _in_time(dialect, deadlined))
        .values(start_calls=TURNS.c.start_calls + 1)
        .returning(TURNS.c.started_at)
    )


@functools.lru_cache(maxsize=2)
def _called(dialect: str) -> Any:
    """The journal row of a call that began nothing (``t_outcome``); it returns when the
    call arrived."""
    return (
        START_CALLS.insert()
        .values(key=bindparam("t_key"), called_at=_arrived(dialect), outcome=bindparam("t_outcome"))
        .returning(START_CALLS.c.called_at)
    )


@contextlib.contextmanager
def _store(engine: Engine) -> Iterator[Connection]:
    """A connection to the store for :func:`pieces.send`: in autocommit where the pieces go
    together as one statement (one statement is atomic by itself)."""
    with engine.connect() as connection:
        if pieces.together(connection):
            connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        yield connection


def _reset_at(
    started_at: datetime,
    began: float,
    reset_after: Any,
    states: list[list[Any]],
    elapsed: float,
) -> datetime:
    if reset_after is not None:
        return started_at + timedelta(seconds=began + float(reset_after))
    index = next((i for i, e in enumerate(states) if e[0] == "rate_limited" and len(e) == 2), None)
    duration = float(states[index][1]) if index is not None else 60.0
    return started_at + timedelta(seconds=max(began + duration, elapsed))
