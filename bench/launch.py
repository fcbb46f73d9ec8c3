"""Item 6: launch throughput, over the Python API and over HTTP, idempotency checks on.

Every launch sets ``request_id``, so each pays the idempotency lookup. Launched runs go to a
queue no worker reads (the stack's queue, with the worker stopped, or a separate one): this
measures the launch path, not execution. Measured:

* sequential launches (one caller): seconds per launch and launches per second;
* the same ``request_id`` values again: each must return the same run and write nothing;
* four threads launching at once;
* new launches again beside ``LIVE`` live runs of the same owner (inserted in bulk, deleted
  after): the admission reads the live-run counts, not the live runs, so this is the same cost;
* the baseline: sending a one-task Celery chain through the same client app.

HTTP goes through ``orchestration api`` (uvicorn) with a bearer token, one keep-alive client;
its baseline is the Python API call it wraps, measured in the same run.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from celery import chain
from sqlalchemy import delete, func, select, text

from bench import engine, stats
from bench.names import NOOP
from bench.stack import Stack
from orchestration.core.db import session_scope, utcnow
from orchestration.core.models import Run

FLOW = engine.workflow("launch", 3, states=[["completed"]], poll_interval=1.0)
#: Live runs of the launching owner beside the second round of new launches.
LIVE = 10_000
#: ``LIVE`` queued runs of one owner, in one statement (the columns a run cannot be without).
_BULK_LIVE = text(
    "INSERT INTO runs (id, owner, request_id, fingerprint, workflow_name, workflow, args, "
    "status, cause, created_at, updated_at, heartbeat_at, task_ids, current_step, rearms, "
    "needs_review) SELECT md5(:owner || g), :owner, 'bulk-' || g, repeat('f', 64), 'bulk', "
    "'{}'::jsonb, '{}'::jsonb, 'queued', 'bench seed', now(), now(), now(), '[]'::jsonb, 0, "
    "0, false "
    "FROM generate_series(1, :count) AS g"
)


def _count_runs(stack: Stack) -> int:
    with session_scope(stack.settings.database_url) as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def _timed(calls: list[Any]) -> list[float]:
    seconds = []
    for call in calls:
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def _rate(samples: list[float]) -> dict[str, Any]:
    return {
        "per_launch_s": stats.distribution(samples),
        "launches_per_s": 1.0 / stats.median(samples),
    }


def python_api(stack: Stack, count: int, threads: int = 4) -> dict[str, Any]:
    """Sequential, duplicate and threaded launches through ``Orchestrator.launch``."""
    orch = stack.orchestrator()
    app = stack.celery()
    owner = f"bench-launch-{uuid.uuid4().hex[:6]}"
    orch.launch(FLOW, owner=owner, request_id="warm")  # provider, pool, compiled statements
    queue = stack.settings.queue

    def bare() -> None:
        chain(app.signature(NOOP, immutable=True, queue=queue)).apply_async()

    ids = [uuid.uuid4().hex for _ in range(count)]
    created: list[str] = []

    def launch(request_id: str) -> None:
        created.append(orch.launch(FLOW, owner=owner, request_id=request_id).id)

    baseline = _timed([bare for _ in range(count)])
    first = _timed([lambda rid=rid: launch(rid) for rid in ids])
    before = _count_runs(stack)
    again_ids: list[str] = []

    def relaunch(request_id: str) -> None:
        again_ids.append(orch.launch(FLOW, owner=owner, request_id=request_id).id)

    again = _timed([lambda rid=rid: relaunch(rid) for rid in ids])
    idempotent = again_ids == created and _count_runs(stack) == before
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(
            pool.map(
                lambda _: orch.launch(FLOW, owner=owner, request_id=uuid.uuid4().hex),
                range(count),
            )
        )
    threaded = count / (time.perf_counter() - started)
    crowded = _beside_live(stack, owner, lambda: launch(uuid.uuid4().hex), bare, count)
    return {
        "launches": count,
        "steps_per_workflow": len(FLOW["steps"]),
        "new": _rate(first),
        "duplicate": _rate(again),
        "duplicates_returned_same_run_and_wrote_nothing": idempotent,
        f"threads_{threads}_launches_per_s": threaded,
        "baseline_bare_chain_send": _rate(baseline),
        "ratio_new_to_bare_send": stats.ratio(stats.median(first), stats.median(baseline)),
        "beside_live": crowded,
    }


def _beside_live(stack: Stack, owner: str, launch: Any, bare: Any, count: int) -> dict[str, Any]:
    """New launches (and bare sends, interleaved) while ``owner`` has :data:`LIVE` more live
    runs; the bulk runs are deleted after."""
    with session_scope(stack.settings.database_url) as session:
        session.execute(_BULK_LIVE, {"owner": owner, "count": LIVE})
    # As autovacuum would soon after a tenth of the table changed: the planner then knows
    # this owner is not selective, and looks the request id up by its unique index.
    with session_scope(stack.settings.database_url, autocommit=True) as session:
        session.execute(text("ANALYZE runs"))
    try:
        new, baseline = [], []
        for _ in range(count):
            baseline += _timed([bare])
            new += _timed([launch])
    finally:
        with session_scope(stack.settings.database_url) as session:
            session.execute(delete(Run).where(Run.request_id.like("bulk-%"), Run.owner == owner))
    return {
        "live_runs": LIVE,
        "new": _rate(new),
        "baseline_bare_chain_send": _rate(baseline),
        "ratio_new_to_bare_send": stats.ratio(stats.median(new), stats.median(baseline)),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_api(stack: Stack, count: int) -> dict[str, Any]:
    """Sequential and duplicate launches through ``POST /runs``; Python API baseline."""
    try:
        from orchestration.surfaces.api import tokens
    except ImportError as exc:  # the HTTP surface is optional (the ``api`` extra)
        return {"skipped": f"the HTTP API cannot be imported: {exc}"}
    owner = f"bench-http-{uuid.uuid4().hex[:6]}"
    with session_scope(stack.settings.database_url) as session:
        token = tokens.create(session, owner, "bench", now=utcnow())
    port = _free_port()
    cli = Path(sys.executable).with_name("orchestration")
    log = (stack.folder / "api.log").open("ab")
    server = subprocess.Popen(
        [str(cli), "api", "--port", str(port), "--log-level", "warning"],
        env=stack.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.get("/healthz")  # any answer (503: no sweeper here) means it serves
                    break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the API server did not come up; see api.log")
                time.sleep(0.1)
            client.post("/runs", json={"workflow": FLOW, "request_id": "warm"})
            ids = [uuid.uuid4().hex for _ in range(count)]
            created: list[str] = []
            again_ids: list[str] = []

            def post(request_id: str, into: list[str]) -> None:
                response = client.post("/runs", json={"workflow": FLOW, "request_id": request_id})
                response.raise_for_status()
                into.append(response.json()["id"])

            orch = stack.orchestrator()
            api_owner = f"bench-http-py-{uuid.uuid4().hex[:6]}"
            orch.launch(FLOW, owner=api_owner, request_id="warm")
            python = _timed(
                [
                    lambda: orch.launch(FLOW, owner=api_owner, request_id=uuid.uuid4().hex)
                    for _ in range(count)
                ]
            )
            first = _timed([lambda rid=rid: post(rid, created) for rid in ids])
            before = _count_runs(stack)
            again = _timed([lambda rid=rid: post(rid, again_ids) for rid in ids])
            idempotent = again_ids == created and _count_runs(stack) == before
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    return {
        "launches": count,
        "new": _rate(first),
        "duplicate": _rate(again),
        "duplicates_returned_same_run_and_wrote_nothing": idempotent,
        "baseline_python_api": _rate(python),
        "ratio_new_to_python_api": stats.ratio(stats.median(first), stats.median(python)),
    }
