"""Names of the bare baseline tasks (``bench.bare_app``), importable without building the
worker's app: the benchmark driver sends them by name through the client app."""

from __future__ import annotations

NOOP = "bench.bare.noop"
MARK = "bench.bare.mark"
LOOP = "bench.bare.loop"
