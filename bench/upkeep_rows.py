"""The rows of ``bench.upkeep``: N old terminal runs, recent and live ones that must survive a
prune, their artifacts (some hashes shared), and what the database holds before and after.

Bulk SQL, as ``bench.sweep_cost`` seeds: 100k launches through the engine would take hours
and measure the launch path, not retention.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from orchestration.core import status_triggers
from orchestration.core.db import get_engine, session_scope
from orchestration.core.models import Artifact, Checkpoint, Effect, Run, RunEvent, Step
from orchestration.core.settings import Settings
from orchestration.runs import artifacts

OWNERS = ("acme", "globex", "initech", "umbrella")
TABLES = (Run, Step, RunEvent, Effect, Checkpoint, Artifact)
#: Every fifth run's last step answered a few KB, kept as an artifact (as it is with an
#: ``ORCH_INLINE_OUTPUT_BYTES`` of a few KB).
ARTIFACT_EVERY = 5
ARTIFACT_BYTES = 4096
STEPS = ("plan", "draft", "review")
WORKFLOW = {
    "name": "report",
    "steps": [
        {
            "id": step,
            "provider": "scripted",
            "task": f"{step} the report on {{{{ args.topic }}}}",
            "with": {},
            "timeout": 1800.0,
            "poll_interval": 1.0,
            "max_poll_interval": 10.0,
        }
        for step in STEPS
    ],
}
#: The journal of a completed three-step run whose last turn parked once: six transitions.
EVENTS = (
    (None, "pending", "running"),
    ("plan", "running", "completed"),
    ("draft", "running", "completed"),
    ("review", "running", "parked"),
    ("review", "parked", "completed"),
    (None, "running", "completed"),
)


@dataclass
class Seeded:
    """What the seed wrote: the run ids that must survive, and the artifacts they reference."""

    survivors: list[str]
    #: Journal rows the survivors own.
    survivor_events: int
    kept_artifacts: set[tuple[str, str]]
    artifacts: int


def payload(number: int) -> str:
    """The text of seeded artifact ``number``: numbers ``2j`` and ``2j + 1`` (runs of two
    owners) hold the same bytes, so a hash is shared across owners in separate rows."""
    seed = hashlib.sha256(str(number // 2).encode()).hexdigest()
    return (seed * (ARTIFACT_BYTES // len(seed) + 1))[:ARTIFACT_BYTES]


def run_rows(
    index: int,
    status: str,
    ended: datetime | None,
    now: datetime,
    shared: dict[Any, Any],
    pool: int = 1,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One run, its three steps and (when ended) its six journal rows. Artifact run ``k``
    stores payload ``k % pool`` (``pool`` a multiple of four, so the runs sharing a number
    share an owner and one row); ``(owner, sha256) -> (bytes, created, used)`` goes into
    ``shared``."""
    run_id = uuid.uuid4().hex
    owner = OWNERS[index % len(OWNERS)]
    at = ended or now
    run = {
        "id": run_id,
        "owner": owner,
        "request_id": run_id,
        "fingerprint": "f" * 64,
        "workflow_name": "report",
        "workflow": WORKFLOW,
        "args": {"topic": f"topic {index}"},
        "status": status,
        "cause": "bench seed",
        "stop_reason": "completed" if ended else None,
        "created_at": at - timedelta(minutes=3),
        "started_at": at - timedelta(minutes=3),
        "updated_at": at,
        "heartbeat_at": at,
        "finished_at": ended,
        "deadline_at": None if ended else now + timedelta(hours=1),
        "task_ids": [run_id],
        "current_step": 2 if ended else 0,
        "rearms": 0,
        "needs_review": False,
    }
    steps = []
    for position, step_id in enumerate(STEPS):
        done = ended is not None
        output: Any = {"text": f"{step_id} of topic {index}: " + "lorem ipsum " * 20}
        sha256 = None
        if ended is not None and position == 2 and index % ARTIFACT_EVERY == 0:
            data = payload((index // ARTIFACT_EVERY) % pool).encode()
            sha256 = hashlib.sha256(data).hexdigest()
            created, used = shared.get((owner, sha256), (data, at, at))[1:]
            shared[(owner, sha256)] = (data, min(created, at), max(used, at))
            output = artifacts.ref(sha256, len(data), artifacts.TEXT)
        steps.append(
            {
                "run_id": run_id,
                "index": position,
                "step_id": step_id,
                "provider": "scripted",
                "status": "completed" if done else ("running" if position == 0 else "pending"),
                "cause": "bench seed",
                "attempt": 1,
                "polls": 3 if done else 0,
                "input": f"{step_id} the report",
                "output": output if done else None,
                "output_sha256": sha256,
                "created_at": at,
                "updated_at": at,
            }
        )
    events = [
        {
            "run_id": run_id,
            "step_id": step,
            "from_status": old,
            "to_status": new,
            "cause": "bench seed",
            "at": at,
        }
        for step, old, new in (EVENTS if ended else EVENTS[:1])
    ]
    return run, steps, events


def seed(url: str, old: int, recent: int, live: int, now: datetime) -> Seeded:
    """``old`` runs that ended 40 days ago, ``recent`` that ended a day ago, ``live`` running
    (healthy at ``now``), in chunks of 5,000 runs a transaction."""
    shared: dict[Any, Any] = {}
    survivors: list[str] = []
    survivor_events = 0
    pool = max(4, old // ARTIFACT_EVERY * 3 // 4 // 4 * 4)
    groups = (
        (old, "completed", now - timedelta(days=40)),
        (recent, "completed", now - timedelta(days=1)),
        (live, "running", None),
    )
    engine = get_engine(url)
    index = 0
    for count, status, ended in groups:
        for start in range(0, count, 5000):
            runs, steps, events = [], [], []
            for _ in range(min(5000, count - start)):
                run, run_steps, run_events = run_rows(index, status, ended, now, shared, pool)
                index += 1
                runs.append(run)
                steps += run_steps
                events += run_events
                if ended is None or ended > now - timedelta(days=30):
                    survivors.append(run["id"])
                    survivor_events += len(run_events)
            with engine.begin() as connection, status_triggers.suspended(connection):
                connection.execute(insert(Run), runs)
                connection.execute(insert(Step), steps)
                connection.execute(insert(RunEvent), events)
    rows = [
        {
            "owner": owner,
            "sha256": sha256,
            "size": len(data),
            "media_type": artifacts.TEXT,
            "content": data,
            "created_at": created,
            "used_at": used,
        }
        for (owner, sha256), (data, created, used) in shared.items()
    ]
    with engine.begin() as connection:
        connection.execute(insert(Artifact), rows)
    kept = {key for key, (_, _, used) in shared.items() if used > now - timedelta(days=30)}
    return Seeded(survivors, survivor_events, kept, len(rows))


def _postgres(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def vacuum(url: str, full: bool = False) -> None:
    """``VACUUM ANALYZE`` every table (as autovacuum leaves a live database), or ``VACUUM
    FULL`` (which rewrites the tables under an exclusive lock: what the space shrinks to)."""
    engine = get_engine(url).execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        if not _postgres(url):
            connection.execute(text("VACUUM"))
            return
        for model in TABLES:
            kind = "FULL" if full else "ANALYZE"
            connection.execute(text(f"VACUUM {kind} {model.__tablename__}"))


def footprint(url: str) -> dict[str, Any]:
    """Rows per table, bytes per table with its indexes and TOAST (``pg_total_relation_size``;
    ``None`` on SQLite, which has no per-table size), and the whole database's bytes."""
    sizes: dict[str, Any] = {}
    with session_scope(url) as session:
        rows = {
            model.__tablename__: int(session.scalar(select(func.count()).select_from(model)) or 0)
            for model in TABLES
        }
        if _postgres(url):
            for name in rows:
                sizes[name] = int(session.scalar(text(f"SELECT pg_total_relation_size('{name}')")))
            database = int(session.scalar(text("SELECT pg_database_size(current_database())")))
        else:
            pages = int(session.scalar(text("PRAGMA page_count")))
            database = pages * int(session.scalar(text("PRAGMA page_size")))
    return {"rows": rows, "bytes": {name: sizes.get(name) for name in rows}, "database": database}


def _count(session: Session, model: Any, *where: Any) -> int:
    return int(session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def check(url: str, cutoff: datetime, seeded: Seeded) -> dict[str, int]:
    """Raise unless every survivor is whole (its steps, its journal, its artifacts readable)
    and no row of an old terminal run, nor an artifact nothing references, is left."""
    survivors = seeded.survivors
    with session_scope(url) as session:
        counts = {
            "old_runs_left": _count(session, Run, Run.finished_at < cutoff),
            "survivors_missing": len(survivors) - _count(session, Run, Run.id.in_(survivors)),
            "survivor_steps_missing": 3 * len(survivors)
            - _count(session, Step, Step.run_id.in_(survivors)),
            "survivor_events_missing": seeded.survivor_events
            - _count(session, RunEvent, RunEvent.run_id.in_(survivors)),
            "orphan_steps": _count(session, Step, Step.run_id.not_in(select(Run.id))),
            "orphan_events": _count(session, RunEvent, RunEvent.run_id.not_in(select(Run.id))),
        }
        kept = {
            (owner, sha256)
            for owner, sha256 in session.execute(select(Artifact.owner, Artifact.sha256))
        }
        counts["kept_artifacts_missing"] = len(seeded.kept_artifacts - kept)
        counts["unreferenced_artifacts_left"] = len(kept - seeded.kept_artifacts)
        settings = Settings(database_url=url)
        for owner, sha256 in sorted(seeded.kept_artifacts & kept)[:50]:
            data = artifacts.load(session, settings, owner, {"sha256": sha256})
            counts["kept_artifacts_missing"] += int(len(data) != ARTIFACT_BYTES)
    bad = {key: value for key, value in counts.items() if value}
    if bad:
        raise SystemExit(f"prune left the database wrong: {bad}")
    return counts
