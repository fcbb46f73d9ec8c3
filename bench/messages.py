"""Message bytes: what the engine really publishes for a run, by run length.

* ``segments``: the client-side send of every chain segment of an ``N``-link run, exactly as
  the engine sends one (``CeleryQueue.send_chain(plan_chain(...))``, at most
  ``chains.SEGMENT_LINKS`` links each), to a queue nobody reads: the JSON bytes of each.
* ``per_step``: whole runs on the stack's worker, traced with ``before_task_publish`` in
  every process that publishes (the benchmark's, for the launch; the pool children, for
  each next link and each retry): total bytes over an ``N``-link run of instant steps, per
  step; and the retry message of a step that polls inside a 200-link run (it should carry
  no chain).

Sizes are the JSON of the message body (``(args, kwargs, embed)``, the chain of the links
after this one in ``embed``) plus its headers, as handed to kombu; the transport adds a
constant envelope (and base64 of the body on Redis).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis
from celery.signals import before_task_publish

from bench import engine, stats, trace
from bench.stack import Stack

#: The run lengths the target compares (bytes per step at 200 within 1.2x of those at 2).
LENGTHS = (2, 200)


@contextlib.contextmanager
def _listening() -> Iterator[list[trace.Published]]:
    """Messages published by this process while open."""
    seen: list[trace.Published] = []

    def measure(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
        seen.append(trace.published(sender, body, headers))

    before_task_publish.connect(measure, weak=False)
    try:
        yield seen
    finally:
        before_task_publish.disconnect(measure)


def segments(stack: Stack, lengths: list[int]) -> dict[str, Any]:
    """JSON bytes of each chain segment the engine sends for runs of each length."""
    from orchestration.runs import chains
    from orchestration.runtime.celery_queue import CeleryQueue, client_queue

    void = f"bench-void-{uuid.uuid4().hex[:8]}"
    sender = CeleryQueue(
        client_queue(stack.settings).app, stack.settings.model_copy(update={"queue": void})
    )
    out: dict[str, Any] = {"segment_links": chains.SEGMENT_LINKS}
    try:
        for length in lengths:
            run_id = uuid.uuid4().hex
            with _listening() as seen:
                for first in range(0, length, chains.SEGMENT_LINKS):
                    sender.send_chain(chains.plan_chain(run_id, first, length))
            sizes = [message.bytes for message in seen]
            out[str(length)] = {
                "segments": len(sizes),
                "first_bytes": sizes[0] if sizes else None,
                "max_bytes": max(sizes, default=None),
                "total_bytes": sum(sizes),
            }
    finally:
        redis.Redis.from_url(stack.settings.broker_url).delete(void)
    return out


def _polling_flow(links: int) -> dict[str, Any]:
    """``links`` instant steps but the first, which polls every 0.02 s for a while."""
    flow = engine.workflow("bytes-poll", links, states=[["completed"]], poll_interval=0.01)
    flow["steps"][0]["with"]["states"] = [["running", 3600]]
    flow["steps"][0]["poll_interval"] = flow["steps"][0]["max_poll_interval"] = 0.02
    return flow


def _of_run(rows: list[trace.Published], run_id: str) -> list[trace.Published]:
    return [row for row in rows if row.first_arg == run_id]


def per_step(stack: Stack, lengths: list[int], retries: int = 5) -> dict[str, Any]:
    """Bytes published over whole instant runs of each length, per step; and the size of a
    poll's retry message in a 200-link run."""
    flag = stack.trace_dir / trace.PUBLISH_ON
    orch = stack.orchestrator()
    runs: dict[int, str] = {}
    flag.touch()
    try:
        with _listening() as local:
            for length in lengths:
                flow = engine.workflow("bytes", length, states=[["completed"]], poll_interval=0.01)
                record = orch.launch(flow, owner="bench-bytes", request_id=uuid.uuid4().hex)
                status, _ = engine.wait_terminal(stack.settings, record.id, 60 + length)
                if status != "completed":
                    raise RuntimeError(f"bytes run of {length} ended {status}")
                runs[length] = record.id
            record = orch.launch(
                _polling_flow(200), owner="bench-bytes", request_id=uuid.uuid4().hex
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                polled = [
                    row
                    for row in _of_run(trace.read_published(stack.trace_dir), record.id)
                    if row.retries
                ]
                if len(polled) >= retries:
                    break
                time.sleep(0.05)
            orch.cancel(record.id, owner="bench-bytes")
        time.sleep(0.3)  # the last lines of the pool children
    finally:
        flag.unlink(missing_ok=True)
    rows = trace.read_published(stack.trace_dir) + local
    out: dict[str, Any] = {}
    for length, run_id in runs.items():
        mine = _of_run(rows, run_id)
        total = sum(row.bytes for row in mine)
        out[str(length)] = {
            "messages": len(mine),
            "total_bytes": total,
            "bytes_per_step": total / length,
            "max_message_bytes": max((row.bytes for row in mine), default=None),
        }
    retry_sizes = [row.bytes for row in _of_run(rows, record.id) if row.retries]
    first = [row.bytes for row in _of_run(rows, record.id) if not row.retries]
    out["poll_retry"] = {
        "links_in_run": 200,
        "retry_bytes": stats.distribution([float(size) for size in retry_sizes]),
        "first_message_bytes": first[0] if first else None,
    }
    small, large = (out.get(str(length), {}).get("bytes_per_step") for length in LENGTHS)
    out["ratio_200_to_2"] = stats.ratio(large, small) if small and large else None
    return out
