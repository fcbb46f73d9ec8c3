"""The baseline's supplement: what issue 11's targets need and the bench of ``971f8fd`` did not
measure, measured against that engine with this bench's counters (``bench.counting``,
``bench.messages``, the publish trace of ``bench.bare_app``).

Run from an archive of the old commit, with the new counters copied in (the old engine's
``Stepper(settings, None)`` and ``launching.launch(settings, None, ...)`` are called here)::

    mkdir /tmp/bench-before && git archive 971f8fd | tar -x -C /tmp/bench-before
    cp bench/{counting,messages,trace,bare_app}.py /tmp/bench-before/bench/
    cd /tmp/bench-before && PYTHONPATH=$PWD /work/main/.venv/bin/python \
        /work/main/bench/baseline/supplement.py --out supplement.json

It writes ``{"profile": {"statements": ..., "instant": ...}, "messages": {"per_step": ...}}`` in
the shape the new report has, which ``bench.targets.load_baseline`` merges over the baseline.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from orchestration.stepper import Poll, Proceed, Stepper  # type: ignore[import-not-found]

from bench import counting, engine, messages
from bench.counting import Counts
from bench.stack import claim_redis, make_stack, release_redis, remove_tree
from orchestration.core.db import utcnow
from orchestration.core.settings import Settings
from orchestration.runs import concurrency, launching


def _launch(settings: Settings, flow: dict[str, Any]) -> str:
    return launching.launch(  # type: ignore[call-arg]
        settings,
        None,
        flow,
        None,
        owner="bench-profile",
        request_id=uuid.uuid4().hex,
        concurrency_key=None,
        on_conflict=concurrency.OnConflict.REJECT,
        now=utcnow(),
    )


def _polls(settings: Settings, counts: Counts, links: int, driven: int) -> dict[str, Any]:
    """``bench.profiling._drive`` on the old API: start, polls, finish of the first steps."""
    flow = engine.workflow(
        "profile", links, states=[["running", 0.08], ["completed"]], poll_interval=0.01
    )
    run_id = _launch(settings, flow)
    stepper = Stepper(settings, None, worker="bench", pid=0)
    samples = []
    for index in range(driven):
        tick, phase = 0, "start"
        while True:
            with counts.counting() as sample:
                outcome = stepper.advance(run_id, index, tick)
            sample["phase"] = "finish" if isinstance(outcome, Proceed) else phase
            samples.append(sample)
            if not isinstance(outcome, Poll):
                break
            tick, phase = outcome.tick, "poll"
            time.sleep(0.012)
    return counting.summarise(samples)


def _instant(settings: Settings, counts: Counts, links: int) -> dict[str, Any]:
    """``bench.profiling.instant_steps`` on the old API (the message always carried the
    rest of the chain: no segments)."""
    flow = engine.workflow("instant", links, states=[["completed"]], poll_interval=0.01)
    run_id = _launch(settings, flow)
    stepper = Stepper(settings, None, worker="bench", pid=0)
    steps = []
    for index in range(links):
        executions: list[dict[str, Any]] = []
        tick = 0
        while len(executions) < 50:
            with counts.counting() as sample:
                outcome = stepper.advance(run_id, index, tick)
            executions.append(sample)
            if not isinstance(outcome, Poll):
                break
            tick = outcome.tick
        if not isinstance(outcome, Proceed):
            raise RuntimeError(f"instant step {index} ended {outcome!r}")
        total = counting.add(executions)
        total["segment_end"] = False
        steps.append(total)
    return counting.summarise_steps(steps, links)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--out", type=Path, default=Path("supplement.json"))
    options = parser.parse_args()
    client = claim_redis(options.redis)
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-supp-"))
    out: dict[str, Any] = {}
    try:
        stack = make_stack(options.postgres, options.redis, tmp, "supplement")
        try:
            counts = Counts(stack.settings.database_url)
            _polls(stack.settings, counts, 2, 1)  # warm
            out["profile"] = {
                "statements": {"as_is": {"200": _polls(stack.settings, counts, 200, 3)}},
                "instant": _instant(stack.settings, counts, 200),
            }
            stack.start_worker()
            out["messages"] = {"per_step": messages.per_step(stack, list(messages.LENGTHS))}
        finally:
            stack.close()
    finally:
        release_redis(client)
        remove_tree(tmp)
    options.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
