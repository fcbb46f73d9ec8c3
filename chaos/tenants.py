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


def tenant_figures(audit: Audit, plans: list[RunPlan]) -> dict[str, Any]:
    """The tenant figures that come from the database and the driver (call after
    :meth:`Audit.figures`, which finds the missed deadlines); adds the scheduled runs still
    live to ``runs_lost`` through the returned ``scheduled_runs_live``."""
    plain_missed = sorted(m for m in audit.missed if is_plain(_root_owner(audit, m)))
    refusals = {plan.label for plan in plans if plan.expect == REFUSED}
    written = sorted(label for label in refusals if label in audit.launched_ids())
    for label in written:
        audit.violation("hostile_launches_not_refused", audit.label_of.get(label), label)
    labels = {plan.label for plan in plans}
    scheduled = [
        run
        for run in audit.runs.values()
        if run.parent_run_id is None and run.request_id not in labels
    ]
    live = [run for run in scheduled if run.status in _LIVE]
    for run in live:
        audit.violation("runs_lost", run.id, f"scheduled run still {run.status} at the end")
    latencies = plain_step_latencies(audit.runs, audit.steps, audit.scenario_of)
    return {
        "plain_runs_past_deadline": len(plain_missed),
        "hostile_launches_not_refused": len(written),
        "launches_refused": len(audit.records.refused),
        "plain_launches_refused": sum(
            1 for plan in plans if plan.label in audit.records.refused and is_plain(plan.owner)
        ),
        "scheduled_runs": len(scheduled),
        "scheduled_runs_live": len(live),
        "plain_step_latency_s": percentiles(latencies),
    }
