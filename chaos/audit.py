"""The figures of a chaos run, read from the database (the truth) and the driver's records.

Must-be-zero figures (any non-zero fails the run):

* ``deadline_misses``: runs that broke a deadline they stated. ``deadline_at`` promises the
  latest time by which a live run is terminal or re-armed. The trigger journal
  (``chaos_run_writes``) holds every deadline a run ever stated, when (database clock) and by
  whom. Each statement must be *answered*, by the next write that changes the run's deadline or
  status, or by its end, no later than the deadline plus ``TOLERANCE`` plus the time the harness
  itself froze the fleet in that interval (a broker outage, a trap holding a table). A run still
  live when the audit starts answers at the audit time. ``worst_lateness_s`` is the largest
  (answer time - deadline) seen, before any excuse: negative means every promise was kept early.
* ``terminal_exits``: journal rows whose ``from_status`` is terminal (a run or step left an end).
* ``turns_duplicated``: ``start`` calls that *began* a turn, per (run, step, attempt) key, above
  one. The turn figures are counted from the scripted provider's own journal of ``start`` calls
  (``scripted_start_calls``: key, the provider's clock, what the call did), not from its turn
  rows: a turn row's key is its primary key, so a second start of a key, or a start after a
  cancel, leaves no second row.
* ``turns_unrecorded_attempt``: turns whose key names an attempt the engine never recorded.
* ``turns_restarted_unexplained``: a ``start`` call on a key that had been called before, which
  the audit cannot show to be the engine recovering a start whose record it lost. A repeat is
  legitimate only when the worker died between the provider's commit and the engine's (the
  provider deduplicates it by key). So it is excused (``turns_restarted_explained``) only when
  all of these hold: the engine had not recorded the turn by the time of the repeat (no
  committed write of the step's ``provider_run_id`` for that key before it, from the
  ``chaos_step_writes`` trigger journal, see :data:`STEP_JOURNAL`); an injected fault that
  lists this run struck between the previous call and the repeat, so it can have killed the
  previous call's transaction; and the repeat came before the run's cancel or end.
* ``turns_started_after_cancel``: a ``start`` call that began a turn after a cancel call
  returned; or after the run's cancel request (its ``cancelling`` write) or its end (its
  terminal write) when the step's start claim (``steps.start_claimed_at``, journalled by
  :data:`STEP_JOURNAL`) had not committed before that write; all to within
  :data:`CLOCK_RESOLUTION`; or a ``start`` that hit a cancel's tombstone. A start claimed
  before the request may reach the provider after it, since ``cancel`` waits for that claim
  before it returns: that is what invariant 2 promises. A ``start`` that arrived after its
  request's deadline (``expired``) began nothing, by the provider contract every runtime that
  can tell arrival time keeps; it is neither a start after a cancel nor a repeat, and is
  reported as ``starts_expired``.
* ``cancels_returned_nonterminal``: hard cancels that returned a live run.
* ``runs_lost``: launched runs not in the database, or still live at the end.
* ``journal_breaks``: a journal row whose ``from_status`` is not the previous row's ``to_status``.
* ``terminal_runs_with_live_steps``: an ended run with a step that did not end.
* ``writes_after_takeover``: a write by a worker cut off by a partition to a run that another
  process took over meanwhile, without fencing the step again (:mod:`chaos.fencing`).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from chaos.driver import Records
from chaos.faults import Fault
from chaos.fencing import WRITE_JOURNAL, cuts_of, read_writes, writes_after_takeover
from chaos.population import RunPlan
from orchestration.core.states import RUN_TERMINAL, STEP_TERMINAL

#: Slack between the provider's clock and the database's when a start call is compared with a
#: write (seconds). Both read the same machine's clock, so only its resolution is allowed.
CLOCK_RESOLUTION = 0.001
#: How long after the trap lets go a statement it caught may still be stamped: the killed
#: worker's backend waits on the lock, and is scheduled to run the statement only after the
#: harness has read its clock on the release (full chaos, RabbitMQ, 2026-12-03: two killed
#: starts stamped 2.2 and 2.8 ms after it, their repeats then counted unexplained).
TRAP_RELEASE_SETTLE = 0.1

#: Allowed past a stated deadline (seconds): the clock's resolution only. The slack the engine
#: states (``deadlines.slack_seconds``) must itself cover its sweep interval, lock waits,
#: commit latency and clocks.
TOLERANCE = CLOCK_RESOLUTION

#: Instrumentation the runner adds beside the run journal (only in the chaos database): every
#: committed write that records a step's provider turn, with the database clock. A row that
#: rolled back (the worker died before its commit) leaves nothing, which is exactly what shows
#: that the engine lost a start it made.
STEP_JOURNAL = """
CREATE TABLE chaos_step_writes (
    id bigserial PRIMARY KEY,
    key varchar(200),
    provider_run_id varchar(200) NOT NULL,
    at timestamptz NOT NULL,
    app text NOT NULL
);
CREATE FUNCTION chaos_note_step() RETURNS trigger AS $$
BEGIN
    INSERT INTO chaos_step_writes (key, provider_run_id, at, app)
    VALUES (NEW.idempotency_key, NEW.provider_run_id, clock_timestamp(),
            current_setting('application_name'));
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TABLE chaos_start_claims (
    id bigserial PRIMARY KEY,
    key varchar(200),
    at timestamptz NOT NULL
);
CREATE FUNCTION chaos_note_claim() RETURNS trigger AS $$
BEGIN
    INSERT INTO chaos_start_claims (key, at) VALUES (NEW.idempotency_key, clock_timestamp());
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER chaos_claim_update AFTER UPDATE ON steps
    FOR EACH ROW WHEN (
        NEW.start_claimed_at IS NOT NULL
        AND OLD.start_claimed_at IS DISTINCT FROM NEW.start_claimed_at
    ) EXECUTE FUNCTION chaos_note_claim();
CREATE TRIGGER chaos_step_insert AFTER INSERT ON steps
    FOR EACH ROW WHEN (NEW.provider_run_id IS NOT NULL) EXECUTE FUNCTION chaos_note_step();
CREATE TRIGGER chaos_step_update AFTER UPDATE ON steps
    FOR EACH ROW WHEN (
        NEW.provider_run_id IS NOT NULL AND (
            OLD.provider_run_id IS DISTINCT FROM NEW.provider_run_id
            OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key
        )
    ) EXECUTE FUNCTION chaos_note_step();
"""

MUST_BE_ZERO = (
    "deadline_misses",
    "terminal_exits",
    "turns_duplicated",
    "turns_unrecorded_attempt",
    "turns_restarted_unexplained",
    "turns_started_after_cancel",
    "cancels_returned_nonterminal",
    "runs_lost",
    "journal_breaks",
    "terminal_runs_with_live_steps",
    "writes_after_takeover",
    # The tenant figures (:mod:`chaos.tenants`, :mod:`chaos.memory`, :mod:`chaos.hostile`).
    "plain_runs_past_deadline",
    "secrets_seen_by_hostile_servers",
    "secrets_stored",
    "hostile_launches_not_refused",
    "hostile_launches_refused_unplanned",
    "worker_memory_over_bound",
)

_RUN_END = {status.value for status in RUN_TERMINAL}
_STEP_END = {status.value for status in STEP_TERMINAL}


def percentiles(values: Iterable[float]) -> dict[str, float | int | None]:
    """Nearest-rank p50, p90, p99 and max of ``values`` (``None`` when empty)."""
    data = sorted(values)
    if not data:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}

    def rank(p: float) -> float:
        return round(data[max(0, math.ceil(p / 100 * len(data)) - 1)], 3)

    return {"n": len(data), "p50": rank(50), "p90": rank(90), "p99": rank(99), "max": rank(100)}


def _overlap(windows: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by ``windows`` (merged first)."""
    total = 0.0
    merged: list[tuple[float, float]] = []
    for low, high in sorted(windows):
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    for low, high in merged:
        total += max(0.0, min(high, end) - max(low, start))
    return total


@dataclass
class Write:
    """One row of the trigger journal."""

    status: str
    deadline: float | None
    heartbeat: float | None
    at: float
    app: str
    rearms: int = 0


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _strike(fault: Fault) -> tuple[float, float]:
    """When ``fault`` could end a worker's open transaction: a kill at the moment the process
    was gone, and for a trapped kill until the statement it caught has run once the trap let
    it go (that statement, the killed call, is stamped when it runs: chaos CI of 2026-12-03
    saw a killed start recorded 2 ms after the kill, its repeat then unexcused; it can be
    stamped a little after the release too, :data:`TRAP_RELEASE_SETTLE`); a stop while the worker
    was frozen (the server aborts its idle transaction); a broker restart or a dropped
    database until the fleet was healed (workers crash or lose their connections in that
    time)."""
    if fault.kind.startswith("kill"):
        if fault.until is None:
            return fault.at, fault.at
        return fault.at, fault.until + TRAP_RELEASE_SETTLE
    return fault.at, max(fault.at, fault.until or fault.at, fault.healed or fault.at)


def instrument(url: str) -> None:
    """Install :data:`STEP_JOURNAL` and :data:`~chaos.fencing.WRITE_JOURNAL` in the fresh
    chaos database at ``url``, before the fleet starts: a write made before it would be
    missing from the journal."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(STEP_JOURNAL)
            connection.exec_driver_sql(WRITE_JOURNAL)
    finally:
        engine.dispose()


class Audit:
    """Reads everything once, then computes the figures."""

    def __init__(
        self,
        engine: Engine,
        records: Records,
        plans: list[RunPlan],
        faults: list[Fault],
        excused: list[tuple[float, float]],
        ended_at: float,
    ) -> None:
        self.records = records
        self.faults = faults
        self.excused = excused
        self.ended_at = ended_at
        self.scenario = {plan.label: plan.scenario for plan in plans}
        self.twice = {plan.label for plan in plans if plan.twice}
        with engine.connect() as connection:
            self.runs = {row.id: row for row in connection.execute(text("SELECT * FROM runs"))}
            self.steps = defaultdict(list)
            for row in connection.execute(text('SELECT * FROM steps ORDER BY run_id, "index"')):
                self.steps[row.run_id].append(row)
            self.events = defaultdict(list)
            for row in connection.execute(text("SELECT * FROM run_events ORDER BY id")):
                self.events[row.run_id].append(row)
            self.turns = list(connection.execute(text("SELECT * FROM scripted_turns")).all())
            self.calls: dict[str, list[Any]] = defaultdict(list)
            for row in connection.execute(
                text("SELECT * FROM scripted_start_calls ORDER BY called_at, id")
            ).all():
                self.calls[row.key].append(row)
            #: Key -> when the engine first committed the turn's ``provider_run_id``.
            self.recorded: dict[str, float] = {
                row.key: float(row.at.timestamp())
                for row in connection.execute(
                    text("SELECT key, min(at) AS at FROM chaos_step_writes GROUP BY key")
                ).all()
            }
            #: Key -> when each start claim of the key committed (database clock).
            self.claims: dict[str, list[float]] = defaultdict(list)
            for row in connection.execute(
                text("SELECT key, at FROM chaos_start_claims ORDER BY at, id")
            ).all():
                self.claims[row.key].append(float(row.at.timestamp()))
            self.writes: dict[str, list[Write]] = defaultdict(list)
            for row in connection.execute(
                text("SELECT * FROM chaos_run_writes ORDER BY at, id")
            ).all():
                self.writes[row.run_id].append(
                    Write(
                        row.status,
                        _ts(row.deadline_at),
                        _ts(row.heartbeat_at),
                        float(row.at.timestamp()),
                        row.app,
                        int(row.rearms or 0),
                    )
                )
            self.all_writes = read_writes(connection)
        self.label_of = {run.request_id: run_id for run_id, run in self.runs.items()}
        self.violations: list[dict[str, Any]] = []
        self.lateness: list[float] = []
        self.net_lateness: list[float] = []
        #: Runs that missed a deadline (set by :meth:`deadlines`).
        self.missed: set[str] = set()

    # -- helpers ----------------------------------------------------------------------------
    def scenario_of(self, run: Any) -> str:
        """The scenario a run was launched for; a branch run's is its parent's, marked."""
        if run.parent_run_id is not None:
            parent = self.runs.get(run.parent_run_id)
            return f"{self.scenario_of(parent) if parent else '?'} (branch runs)"
        # A run nobody planned is a schedule's fire (the storm's).
        return self.scenario.get(run.request_id) or f"scheduled ({run.owner})"

    def violation(self, figure: str, run_id: str | None, detail: str) -> None:
        entry: dict[str, Any] = {"figure": figure, "run_id": run_id, "detail": detail}
        run = self.runs.get(run_id) if run_id else None
        if run is not None and run_id is not None:
            entry["label"] = run.request_id
            entry["scenario"] = self.scenario_of(run)
            entry["status"] = f"{run.status}/{run.stop_reason}"
            entry["journal"] = [
                f"{e.at.isoformat()} {e.step_id or 'run'}: {e.from_status} -> {e.to_status} "
                f"({e.cause})"
                for e in self.events.get(run_id, [])
            ]
            entry["writes"] = [
                f"{w.at:.3f} {w.status} deadline={w.deadline} heartbeat={w.heartbeat} "
                f"rearms={w.rearms} by {w.app}"
                for w in self.writes.get(run_id, [])
            ][-12:]
        self.violations.append(entry)

    def launched_ids(self) -> dict[str, str]:
        """Label -> run id for every launch that returned, and every errored launch that the
        database shows was written (its caller did not learn the id, the run still counts)."""
        ids = dict(self.records.launched)
        for label in self.records.launch_errors:
            for run_id, run in self.runs.items():
                if run.request_id == label:
                    ids[label] = run_id
        return ids

    # -- figures ----------------------------------------------------------------------------
    def deadlines(self) -> int:
        """See the module docstring; returns the number of runs that missed."""
        missed = 0
        for run_id, writes in self.writes.items():
            worst = -math.inf
            stated = deadline = answer = stated_at = 0.0
            previous: Write | None = None
            for write in [*writes, None]:
                if previous is None:
                    previous = write
                    stated_at = write.at if write is not None else 0.0
                    continue
                if write is not None and (
                    write.deadline == previous.deadline and write.status == previous.status
                ):
                    continue  # a heartbeat stamp alone neither states nor answers a deadline
                if previous.status not in _RUN_END and previous.deadline is not None:
                    answered = write.at if write is not None else self.ended_at
                    late = answered - previous.deadline
                    self.lateness.append(late)
                    excuse = _overlap(self.excused, previous.deadline, answered)
                    self.net_lateness.append(late - excuse)
                    if late - excuse > max(TOLERANCE, worst):
                        worst = late - excuse
                        stated, deadline, answer = stated_at, previous.deadline, answered
                previous = write
                stated_at = write.at if write is not None else 0.0
            if worst > -math.inf:
                missed += 1
                self.missed.add(run_id)
                self.violation(
                    "deadline_misses",
                    run_id,
                    f"a deadline stated at {stated:.3f} for {deadline:.3f} was answered at "
                    f"{answer:.3f}, {worst:.2f}s late (net of excused windows); faults "
                    f"around it: {self._faults_near(stated, answer)}",
                )
        return missed

    def stale_writes(self) -> dict[str, Any]:
        """Writes carrying a clock older than the row's: a deadline already past when written,
        or a heartbeat moved backwards. They are not must-be-zero by themselves (a stale
        deadline is judged by the deadline check), but they name the writer."""
        stale: list[str] = []
        regressions: list[str] = []
        for run_id, writes in self.writes.items():
            for before, write in itertools.pairwise(writes):
                if (
                    write.status not in _RUN_END
                    and write.deadline is not None
                    and write.deadline != before.deadline
                    and write.deadline < write.at
                ):
                    stale.append(
                        f"{run_id} {write.status}: deadline {write.at - write.deadline:.2f}s "
                        f"in the past when {write.app} wrote it at {write.at:.3f}"
                    )
                if (
                    write.heartbeat is not None
                    and before.heartbeat is not None
                    and write.heartbeat < before.heartbeat - 0.001
                ):
                    regressions.append(
                        f"{run_id} {write.status}: heartbeat moved back "
                        f"{before.heartbeat - write.heartbeat:.2f}s by {write.app} "
                        f"at {write.at:.3f}"
                    )
        return {
            "stale_statements": len(stale),
            "heartbeat_regressions": len(regressions),
            "stale_examples": (stale + regressions)[:10],
        }

    def _faults_near(self, start: float, end: float) -> str:
        near = [
            f"{f.kind}@{f.at:.1f}" + (f"-{f.until:.1f}" if f.until else "")
            for f in self.faults
            if f.injected
            and f.at <= end
            and max(f.until or f.at, f.outage[1] if f.outage else f.at) >= start - 10
        ]
        return ", ".join(near) or "none"

    def terminal_exits(self) -> int:
        count = 0
        for run_id, events in self.events.items():
            for event in events:
                ends = _STEP_END if event.step_id else _RUN_END
                if event.from_status in ends:
                    count += 1
                    self.violation(
                        "terminal_exits",
                        run_id,
                        f"{event.step_id or 'run'} left {event.from_status} for {event.to_status}",
                    )
        return count

    def journal_breaks(self) -> int:
        count = 0
        for run_id, events in self.events.items():
            last: dict[str | None, str | None] = {}
            for event in events:
                expected = last.get(event.step_id, None if event.step_id is None else "pending")
                if event.from_status != expected:
                    count += 1
                    self.violation(
                        "journal_breaks",
                        run_id,
                        f"{event.step_id or 'run'}: {event.from_status} -> {event.to_status} "
                        f"after {expected}",
                    )
                last[event.step_id] = event.to_status
        return count

    def takeovers(self) -> int:
        """See :mod:`chaos.fencing`; returns the number of writes made after a takeover."""
        found = writes_after_takeover(self.all_writes, cuts_of(self.faults))
        for line in found:
            self.violation("writes_after_takeover", line.split(":", 1)[0], line)
        return len(found)

    def live_steps_in_ended_runs(self) -> int:
        count = 0
        for run_id, run in self.runs.items():
            if run.status in _RUN_END:
                for step in self.steps[run_id]:
                    if step.status not in _STEP_END:
                        count += 1
                        self.violation(
                            "terminal_runs_with_live_steps",
                            run_id,
                            f"step {step.step_id} is {step.status}",
                        )
        return count

    def turns_figures(self) -> dict[str, int]:
        """The turn figures (see the module docstring), from the provider's start journal."""
        figures = Counter(
            {
                "start_calls": sum(len(calls) for calls in self.calls.values()),
                "turns_duplicated": 0,
                "turns_unrecorded_attempt": 0,
                "turns_restarted_unexplained": 0,
                "turns_started_after_cancel": 0,
                "turns_restarted_explained": 0,
                "starts_expired": 0,
            }
        )
        stop_at = self._stop_moments()
        end_at = self._end_moments()
        requested_at = self._request_moments()
        for turn in self.turns:
            run_id, step_id, attempt_text = turn.key.rsplit(":", 2)
            step = next((s for s in self.steps.get(run_id, []) if s.step_id == step_id), None)
            attempt = int(attempt_text) if attempt_text.isdigit() else -1
            if step is None or not 1 <= attempt <= step.attempt:
                figures["turns_unrecorded_attempt"] += 1
                self.violation(
                    "turns_unrecorded_attempt", run_id, f"turn {turn.key} was never recorded"
                )
        for key, journalled in self.calls.items():
            run_id = key.rsplit(":", 2)[0]
            calls = [call for call in journalled if call.outcome != "expired"]
            figures["starts_expired"] += len(journalled) - len(calls)
            stop = stop_at.get(run_id)
            requested = requested_at.get(run_id)
            end = end_at.get(run_id)
            claims = self.claims.get(key, [])

            def claimed_before(moment: float, claims: list[float] = claims) -> bool:
                return any(at <= moment + CLOCK_RESOLUTION for at in claims)

            starts = [call for call in calls if call.outcome == "started"]
            if len(starts) > 1:
                figures["turns_duplicated"] += len(starts) - 1
                self.violation(
                    "turns_duplicated",
                    run_id,
                    f"{len(starts)} start calls began turn {key}: "
                    + ", ".join(f"{call.called_at.timestamp():.3f}" for call in starts),
                )
            for previous, call in itertools.pairwise(calls):
                why_not = self._unexcused_repeat(key, run_id, previous, call, stop)
                if why_not is None:
                    figures["turns_restarted_explained"] += 1
                else:
                    figures["turns_restarted_unexplained"] += 1
                    self.violation(
                        "turns_restarted_unexplained",
                        run_id,
                        f"start of {key} called again at {call.called_at.timestamp():.3f} "
                        f"({call.outcome}; previous call {previous.called_at.timestamp():.3f}, "
                        f"{previous.outcome}): {why_not}",
                    )
            for call in calls:
                called = call.called_at.timestamp()
                if call.outcome == "tombstone":
                    figures["turns_started_after_cancel"] += 1
                    self.violation(
                        "turns_started_after_cancel",
                        run_id,
                        f"start of {key} at {called:.3f} hit a cancel's tombstone",
                    )
                elif (
                    call.outcome == "started"
                    and stop is not None
                    and called > stop[0] + CLOCK_RESOLUTION
                ):
                    figures["turns_started_after_cancel"] += 1
                    self.violation(
                        "turns_started_after_cancel",
                        run_id,
                        f"start of {key} began a turn {called - stop[0]:.3f}s after {stop[1]}",
                    )
                elif (
                    call.outcome == "started"
                    and end is not None
                    and called > end[0] + CLOCK_RESOLUTION
                    and not claimed_before(end[0])
                ):
                    figures["turns_started_after_cancel"] += 1
                    self.violation(
                        "turns_started_after_cancel",
                        run_id,
                        f"start of {key} began a turn {called - end[0]:.3f}s after {end[1]}, "
                        "and its claim had not committed before",
                    )
                elif (
                    call.outcome == "started"
                    and requested is not None
                    and called > requested + CLOCK_RESOLUTION
                    and not claimed_before(requested)
                ):
                    figures["turns_started_after_cancel"] += 1
                    self.violation(
                        "turns_started_after_cancel",
                        run_id,
                        f"start of {key} began a turn {called - requested:.3f}s after the "
                        "cancel request, and its claim had not committed before the request",
                    )
        return dict(figures)

    def _unexcused_repeat(
        self,
        key: str,
        run_id: str,
        previous: Any,
        call: Any,
        stop: tuple[float, str] | None,
    ) -> str | None:
        """Why the repeated start ``call`` (after ``previous`` on the same key) is not the
        engine recovering a start whose record it lost; ``None`` when it is."""
        before, at = previous.called_at.timestamp(), call.called_at.timestamp()
        if stop is not None and at > stop[0] + CLOCK_RESOLUTION:
            return f"it came {at - stop[0]:.3f}s after {stop[1]}"
        recorded = self.recorded.get(key)
        if recorded is not None and recorded < at:
            return f"the engine had recorded the turn {at - recorded:.3f}s before"
        for fault in self.faults:
            if not fault.injected or run_id not in fault.runs:
                continue
            start, end = _strike(fault)
            if start <= at + CLOCK_RESOLUTION and before <= end + CLOCK_RESOLUTION:
                return None
        near = self._faults_near(before, at)
        return f"no fault on this run struck between the two calls (faults near: {near})"

    def _stop_moments(self) -> dict[str, tuple[float, str]]:
        """For each run, the first moment after which no turn may start at all, and why: the
        moment a cancel call returned (invariant 2); for a branch run, its parent's."""
        moments: dict[str, tuple[float, str]] = {}
        for call in self.records.cancels:
            if call.returned is not None and call.status is not None:
                moment = call.returned
                if call.run_id not in moments or moment < moments[call.run_id][0]:
                    moments[call.run_id] = (moment, f"a {call.kind} cancel returned")
        for run_id, run in self.runs.items():
            parent = moments.get(run.parent_run_id) if run.parent_run_id else None
            if parent is not None and (run_id not in moments or parent[0] < moments[run_id][0]):
                moments[run_id] = (parent[0], f"{parent[1]} (on its parent)")
        return moments

    def _end_moments(self) -> dict[str, tuple[float, str]]:
        """For each run, its terminal write (database clock). A start claimed before it may
        still reach the provider after it when the writer was not ``cancel`` (the sweeper, a
        timeout, a preempting launch do not wait for a start in flight; the start then stops
        its own turn); any other start after it is a violation."""
        moments: dict[str, tuple[float, str]] = {}
        for run_id, writes in self.writes.items():
            for write in writes:
                if write.status in _RUN_END:
                    moments[run_id] = (write.at, f"the run became {write.status}")
                    break
        return moments

    def _request_moments(self) -> dict[str, float]:
        """For each run, its cancel request's ``cancelling`` write (database clock): the
        request holds the run row's lock from there to its commit, so no start can be claimed
        after it. The ``at`` of its ``run_events`` row and ``cancel_requested_at`` are the
        canceller's clock read *before* it waited for that lock."""
        moments: dict[str, float] = {}
        for run_id, writes in self.writes.items():
            for write in writes:
                if write.status == "cancelling":
                    moments[run_id] = write.at
                    break
        return moments

    def cancels(self) -> dict[str, int]:
        nonterminal = errors = 0
        for call in self.records.cancels:
            if call.error:
                errors += 1
            elif not call.graceful and call.status not in _RUN_END:
                nonterminal += 1
                self.violation(
                    "cancels_returned_nonterminal",
                    call.run_id,
                    f"{call.kind} cancel ({call.process}) returned {call.status}",
                )
        return {
            "cancel_calls": len(self.records.cancels),
            "cancels_returned_nonterminal": nonterminal,
            "cancel_errors": errors,
        }

    def lost(self, launched: dict[str, str]) -> int:
        count = 0
        for label, run_id in launched.items():
            run = self.runs.get(run_id)
            if run is None:
                count += 1
                self.violation("runs_lost", run_id, f"{label} launched but not in the database")
            elif run.status not in _RUN_END:
                count += 1
                self.violation("runs_lost", run_id, f"{label} still {run.status} at the end")
        return count

    def convergence(self) -> dict[str, Any]:
        """Per fault kind: how long until each affected run moved again, and until it ended."""
        by_kind: dict[str, dict[str, list[float]]] = defaultdict(
            lambda: {"recover": [], "terminal": []}
        )
        counts: Counter[str] = Counter()
        missed: Counter[str] = Counter()
        for fault in self.faults:
            if not fault.injected:
                missed[fault.kind] += 1
                continue
            counts[fault.kind] += 1
            zombie = f"chaos-{fault.victim}" if fault.kind.startswith("stop") else None
            for run_id in fault.runs:
                writes = self.writes.get(run_id, [])
                before = [w for w in writes if w.at <= fault.at]
                if before and before[-1].status in _RUN_END:
                    continue
                after = [
                    w
                    for w in writes
                    if w.at > fault.at
                    and not (zombie and w.app == zombie and w.at < (fault.until or math.inf))
                ]
                if after:
                    by_kind[fault.kind]["recover"].append(after[0].at - fault.at)
                end = next((w for w in after if w.status in _RUN_END), None)
                if end is not None:
                    by_kind[fault.kind]["terminal"].append(end.at - fault.at)
        kinds = sorted(set(counts) | set(missed))
        return {
            kind: {
                "injected": counts[kind],
                "no_target": missed[kind],
                "recover_s": percentiles(by_kind[kind]["recover"]),
                "terminal_s": percentiles(by_kind[kind]["terminal"]),
            }
            for kind in kinds
        }

    def outcomes(self) -> dict[str, Any]:
        by_status = Counter(f"{run.status}/{run.stop_reason}" for run in self.runs.values())
        by_scenario: dict[str, Counter[str]] = defaultdict(Counter)
        for run in self.runs.values():
            by_scenario[self.scenario_of(run)][run.status] += 1
        return {
            "by_status": dict(sorted(by_status.items())),
            "by_scenario": {k: dict(v) for k, v in sorted(by_scenario.items())},
            "rearmed_runs": sum(1 for run in self.runs.values() if run.rearms > 0),
            "needs_review": sum(1 for run in self.runs.values() if run.needs_review),
        }

    # -- all --------------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        launched = self.launched_ids()
        figures: dict[str, Any] = {
            "runs_launched": len(launched),
            "runs_terminal": sum(
                1
                for run_id in launched.values()
                if run_id in self.runs and self.runs[run_id].status in _RUN_END
            ),
            "launches_rejected": len(self.records.rejected),
            "launch_errors": len(self.records.launch_errors),
            "runs_lost": self.lost(launched),
            "deadline_misses": self.deadlines(),
            "worst_lateness_s": round(max(self.lateness), 3) if self.lateness else None,
            "worst_net_lateness_s": (
                round(max(self.net_lateness), 3) if self.net_lateness else None
            ),
            "deadline_statements": len(self.lateness),
            **{k: v for k, v in self.stale_writes().items() if k != "stale_examples"},
            "terminal_exits": self.terminal_exits(),
            "journal_breaks": self.journal_breaks(),
            "terminal_runs_with_live_steps": self.live_steps_in_ended_runs(),
            "writes_after_takeover": self.takeovers(),
            "turns": len(self.turns),
            **self.turns_figures(),
            **self.cancels(),
            "answers": dict(Counter(v.split(":")[0] for v in self.records.answers.values())),
            "resends": len(self.records.resends),
            "duplicate_launches": sum(1 for label in launched if label in self.twice),
        }
        return figures
