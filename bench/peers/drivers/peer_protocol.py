"""The line protocol between the benchmark and a peer's driver, both sides of it.

The driver prints ``bench-ready {json}`` once it is up and warm, then reads one mode per line
on its standard input, times one chain in that mode and prints ``bench-timed {json}`` (or
``bench-failed {json}``); it ends at the end of its input. Any other line on its standard
output (a library's own print) is not part of the protocol and is skipped by :func:`parse`.

Standard library only: the driver side runs in the peer's virtualenv.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

READY = "bench-ready"
TIMED = "bench-timed"
FAILED = "bench-failed"
KINDS = (READY, TIMED, FAILED)


def say(kind: str, payload: dict[str, Any]) -> None:
    """Print one protocol line."""
    print(f"{kind} {json.dumps(payload)}", flush=True)


def parse(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(kind, payload)`` of a protocol line; ``None`` for any other output."""
    kind, _, rest = line.strip().partition(" ")
    if kind not in KINDS:
        return None
    try:
        payload = json.loads(rest)
    except ValueError:
        return None
    return (kind, payload) if isinstance(payload, dict) else None


def timed(run: Callable[[], str]) -> dict[str, Any]:
    """Wall seconds of ``run`` (one chain, from its start to its end) and the status it
    returns, read after the clock stops."""
    started = time.time()
    status = run()
    return {"seconds": time.time() - started, "status": status}


def serve(ready: dict[str, Any], modes: dict[str, Callable[[], dict[str, Any]]]) -> None:
    """Announce ``ready``, then time one chain per mode named on standard input."""
    say(READY, ready)
    for line in sys.stdin:
        mode = line.strip()
        if not mode:
            continue
        if mode not in modes:
            say(FAILED, {"mode": mode, "error": f"unknown mode {mode!r}; known: {sorted(modes)}"})
            continue
        try:
            say(TIMED, {"mode": mode, **modes[mode]()})
        except Exception as exc:
            say(FAILED, {"mode": mode, "error": f"{type(exc).__name__}: {exc}"})
            traceback.print_exc()
