"""Surfaces: how people and programs reach the engine. The command line (``cli``), the demo,
and the HTTP API with its dashboard and ``/metrics`` (``api``). Each calls the Python API
(:mod:`orchestration.service`) or an executor; none writes a row itself."""
