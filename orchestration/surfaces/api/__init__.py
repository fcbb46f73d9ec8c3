"""The HTTP surface: the JSON API, the runs dashboard and ``/metrics``.

Nothing is imported here, so ``orchestration --help`` does not pay for FastAPI; the app lives
in :mod:`orchestration.surfaces.api.app`.
"""
