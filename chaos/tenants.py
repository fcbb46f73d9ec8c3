"""The audit's tenant figures: what hostile owners could do to plain ones, read after the run.

Must-be-zero (listed in :data:`chaos.audit.MUST_BE_ZERO`):

* ``plain_runs_past_deadline``: plain owners' runs that missed a deadline they stated (the
  deadline check of :mod:`chaos.audit`, for plain owners alone: a hostile owner slowing the
  fleet shows here first);
* ``secrets_seen_by_hostile_servers``: requests carrying the bound secret that reached a
  hostile server other than the one it is bound to (:mod:`chaos.hostile`);
* ``secrets_stored``: rows of the chaos database, and lines of the worker logs, holding the
  secret's value (the echo agent sends it back in every answer; redaction must take it out);
* ``hostile_launches_not_refused``: launches planned to be refused (a secret named for a host
  it is not bound to, a fan-out one branch over ``ORCH_MAX_BRANCHES``) that were written;
* ``hostile_launches_refused_unplanned``: hostile launches planned to be written that were
  refused: a hostile population refused at the door hurts nothing, and proves nothing;
* ``worker_memory_over_bound``: worker processes seen above the stated RSS bound
  (:mod:`chaos.memory`).

Besides: scheduled runs still live at the end count in ``runs_lost`` like launched ones, and
the plain owners' step latency (:mod:`chaos.latency`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from chaos.audit import Audit, percentiles
from chaos.hostile import REFUSED, is_plain
from chaos.latency import plain_step_latencies
from chaos.population import RunPlan

_LIVE = {"queued", "running", "waiting", "parked", "cancelling"}


def _root_owner(audit: Audit, run_id: str) -> str:
    run = audit.runs[run_id]
    while run.parent_run_id is not None and run.parent_run_id in audit.runs:
        run = audit.runs[run.parent_run_id]
    return str(run.owner)


def secrets_stored(engine: Engine, secret: str, logs: Path) -> int:
    """Rows of every table, and worker log lines, that hold ``secret`` as it was sent."""
    pattern = "%" + secret.replace("%", r"\%").replace("_", r"\_") + "%"
    count = 0
    with engine.connect() as connection:
        tables = connection.execute(
            text(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
        ).scalars()
        for table in list(tables):
            count += int(
                connection.execute(
                    text(f'SELECT count(*) FROM "{table}" AS row WHERE row::text LIKE :p'),
                    {"p": pattern},
                ).scalar()
                or 0
            )
    for log in logs.glob("*.log"):
        count += sum(1 for line in log.read_text(errors="replace").splitlines() if secret in line)
    return count


def schedule_fires(engine: Engine) -> dict[str, Any]:
    """The schedules' fires per owner and status, and how late each fire was recorded after
    its instant (seconds): the storm's own, and any plain owner's beside it."""
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT owner, status, fire_at, recorded_at FROM schedule_fires")
        ).all()
    counts: dict[str, dict[str, int]] = {}
    late: list[float] = []
    for row in rows:
        by_status = counts.setdefault(row.owner, {})
        by_status[row.status] = by_status.get(row.status, 0) + 1
        late.append((row.recorded_at - row.fire_at).total_seconds())
    return {"fires": counts, "fire_lateness_s": percentiles(late)}


def _peak(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = live = 0
    for _, step in edges:
        live += step
        peak = max(peak, live)
    return peak


def peak_live_runs(audit: Audit) -> dict[str, dict[str, int]]:
    """Per owner, the most runs live at once: its own runs, and with their branch runs
    (which ``ORCH_MAX_ACTIVE_RUNS_PER_OWNER`` is to count): what a per-owner budget must fit."""
    spans: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for run_id, run in audit.runs.items():
        if run.created_at is None:
            continue
        end = run.finished_at.timestamp() if run.finished_at is not None else audit.ended_at
        span = (run.created_at.timestamp(), end)
        owner = spans.setdefault(_root_owner(audit, run_id), {"runs": [], "with_branches": []})
        owner["with_branches"].append(span)
        if run.parent_run_id is None:
            owner["runs"].append(span)
    return {
        owner: {kind: _peak(found) for kind, found in kinds.items()}
        for owner, kinds in sorted(spans.items())
    }


def tenant_figures(audit: Audit, plans: list[RunPlan]) -> dict[str, Any]:
    """The tenant figures that come from the database and the driver (call after
    :meth:`Audit.figures`, which finds the missed deadlines); adds the scheduled runs still
    live to ``runs_lost`` through the returned ``scheduled_runs_live``."""
    plain_missed = sorted(m for m in audit.missed if is_plain(_root_owner(audit, m)))
    refusals = {plan.label for plan in plans if plan.expect == REFUSED}
    written = sorted(label for label in refusals if label in audit.launched_ids())
    for label in written:
        audit.violation("hostile_launches_not_refused", audit.label_of.get(label), label)
    refused = audit.records.refused
    unplanned = sorted(
        plan.label
        for plan in plans
        if plan.expect != REFUSED and not is_plain(plan.owner) and plan.label in refused
    )
    for label in unplanned:
        audit.violation("hostile_launches_refused_unplanned", None, f"{label}: {refused[label]}")
    labels = {plan.label for plan in plans}
    scheduled = [
        run
        for run in audit.runs.values()
        if run.parent_run_id is None and run.request_id not in labels
    ]
    live = [run for run in scheduled if run.status in _LIVE]
    for run in live:
        audit.violation("runs_lost", run.id, f"scheduled run still {run.status} at the end")
    struck = {run_id for fault in audit.faults if fault.injected for run_id in fault.runs}
    latencies = plain_step_latencies(audit.runs, audit.steps, audit.scenario_of, struck)
    return {
        "plain_runs_past_deadline": len(plain_missed),
        "hostile_launches_not_refused": len(written),
        "hostile_launches_refused_unplanned": len(unplanned),
        "launches_refused": len(audit.records.refused),
        "plain_launches_refused": sum(
            1 for plan in plans if plan.label in audit.records.refused and is_plain(plan.owner)
        ),
        "scheduled_runs": len(scheduled),
        "scheduled_runs_live": len(live),
        "plain_step_latency_s": percentiles(latencies),
        "peak_live_runs": peak_live_runs(audit),
    }
