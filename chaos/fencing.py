"""The fence under a partition: a worker cut off while its step held the fence must not write
to the run once another process has taken it over, unless it fences the step again first.

:data:`WRITE_JOURNAL` journals every write to ``runs`` and ``steps`` and every ``run_events``
row, with the writer's ``application_name`` and the database clock, and for a ``steps`` write
whether it moved the fencing tick (``polls``) forward: a fence. For each partition fault on
a namespaced worker (``chaos-net<n>``, one started per fault), a run it held is *taken over*
at the first re-arm of the run (its ``rearms`` grew) or the first fence of its step by
another process, after the cut. From then on, each write by the cut worker to that run
counts in ``writes_after_takeover`` (must be 0) unless the cut worker had fenced the step
again in between (a delivery it held that legitimately won the fence), or the write is a
*hand-off* under the cut worker's own start claim. The check is per worker, not per prefork
child.

The hand-off: a start whose answer comes back after its run moved on gives the turn's id to
the step and clears its claim (``orchestration.execution.releasing``), in one statement whose
``WHERE`` holds the step to that very claim. The claim is the start's own lease, apart from the
tick: an execution that fences the step while the claim is live may not start the turn, nor
record one, and only polls again (``Refusal.IN_FLIGHT``), so writing the turn's id under the
claim overwrites nothing the taking execution wrote; once the claim was taken again, the
statement writes nothing. The journal marks such a write (``handoff``: only the claim, the
turn's id and ``updated_at`` change, the claim to ``NULL``, a turn where there was none) with
the claim it cleared, and the check passes it when that claim is one the cut worker wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

#: Kinds whose victim is cut off while it holds steps (see :mod:`chaos.partitions`).
FENCED_KINDS = ("net_cut", "net_oneway")

WRITE_JOURNAL = """
CREATE TABLE chaos_writes (
    id bigserial PRIMARY KEY,
    tbl text NOT NULL,
    run_id varchar(32) NOT NULL,
    fence boolean NOT NULL,
    rearm boolean NOT NULL,
    at timestamptz NOT NULL,
    app text NOT NULL,
    claim timestamptz,
    handoff boolean NOT NULL DEFAULT false
);
CREATE FUNCTION chaos_note_write() RETURNS trigger AS $$
DECLARE
    run varchar(32);
    fenced boolean := false;
    rearmed boolean := false;
    claim timestamptz;
    handoff boolean := false;
    kept text[] := ARRAY['start_claimed_at', 'provider_run_id', 'updated_at'];
BEGIN
    IF TG_TABLE_NAME = 'runs' THEN
        run := NEW.id;
        rearmed := TG_OP = 'UPDATE' AND NEW.rearms > OLD.rearms;
    ELSE
        run := NEW.run_id;
        IF TG_TABLE_NAME = 'steps' AND TG_OP = 'UPDATE' THEN
            fenced := NEW.polls > OLD.polls;
            IF NEW.start_claimed_at IS NOT NULL
               AND NEW.start_claimed_at IS DISTINCT FROM OLD.start_claimed_at THEN
                claim := NEW.start_claimed_at;
            END IF;
            handoff := OLD.start_claimed_at IS NOT NULL AND NEW.start_claimed_at IS NULL
                AND OLD.provider_run_id IS NULL
                AND (to_jsonb(NEW) - kept) = (to_jsonb(OLD) - kept);
            IF handoff THEN
                claim := OLD.start_claimed_at;
            END IF;
        END IF;
    END IF;
    INSERT INTO chaos_writes (tbl, run_id, fence, rearm, at, app, claim, handoff)
    VALUES (TG_TABLE_NAME, run, fenced, rearmed, clock_timestamp(),
            current_setting('application_name'), claim, handoff);
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER chaos_write_runs AFTER UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION chaos_note_write();
CREATE TRIGGER chaos_write_steps AFTER UPDATE ON steps
    FOR EACH ROW EXECUTE FUNCTION chaos_note_write();
CREATE TRIGGER chaos_write_events AFTER INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION chaos_note_write();
"""


@dataclass(frozen=True)
class Written:
    """One row of :data:`WRITE_JOURNAL`."""

    table: str
    run_id: str
    fence: bool
    rearm: bool
    at: float
    app: str
    #: The start claim this write set, or, for a hand-off, the one it cleared.
    claim: float | None = None
    #: Whether it is a hand-off under a start claim (see the module docstring).
    handoff: bool = False


@dataclass(frozen=True)
class Cut:
    """A partition fault as the check needs it: who was cut, when, and the runs it held."""

    victim_app: str
    at: float
    runs: tuple[str, ...]


def read_writes(connection: Connection) -> dict[str, list[Written]]:
    """The journal, per run, in the order of the database clock."""
    writes: dict[str, list[Written]] = {}
    for row in connection.execute(text("SELECT * FROM chaos_writes ORDER BY at, id")):
        writes.setdefault(row.run_id, []).append(
            Written(
                row.tbl,
                row.run_id,
                row.fence,
                row.rearm,
                row.at.timestamp(),
                row.app,
                None if row.claim is None else row.claim.timestamp(),
                row.handoff,
            )
        )
    return writes


def writes_after_takeover(writes: dict[str, list[Written]], cuts: list[Cut]) -> list[str]:
    """One line per write that a cut worker made to a run after another process took the
    run over, without fencing the step again first (see the module docstring)."""
    found: list[str] = []
    for cut in cuts:
        for run_id in cut.runs:
            taken: float | None = None
            refenced = False
            own_claims: set[float] = set()
            for write in writes.get(run_id, []):
                if write.app == cut.victim_app and write.claim is not None and not write.handoff:
                    own_claims.add(write.claim)
                if write.at <= cut.at:
                    continue
                if write.app != cut.victim_app:
                    if taken is None and (write.rearm or write.fence):
                        taken = write.at
                    continue
                if taken is None:
                    continue
                if write.fence:
                    refenced = True
                elif not refenced and not (write.handoff and write.claim in own_claims):
                    found.append(
                        f"{run_id}: {cut.victim_app} wrote {write.table} at {write.at:.3f}, "
                        f"{write.at - taken:.3f}s after the run was taken over "
                        f"(cut at {cut.at:.3f})"
                    )
    return found


def cuts_of(faults: list[Any]) -> list[Cut]:
    """The injected partition faults that left a worker cut off while it held steps."""
    return [
        Cut(f"chaos-{fault.victim}", fault.at, tuple(fault.runs))
        for fault in faults
        if fault.kind in FENCED_KINDS and fault.injected and fault.victim
    ]
