"""The benchmark worker's app with ``Run.steps`` loaded lazily: an experiment, not a fix.

    celery -A bench.lazy_app worker ...

Same as :mod:`bench.bare_app`, except that the ``Run.steps`` relationship is switched from
``lazy="selectin"`` to ``lazy="select"`` in this process (and its forked pool) before any
task runs, so ``python -m bench.experiments`` can price that change in a real worker without
touching the engine's code. Nothing in the engine reads ``Run.steps``.
"""

from __future__ import annotations

from sqlalchemy.orm import configure_mappers

from bench.bare_app import app
from orchestration.core.models import Run

__all__ = ["app"]

configure_mappers()
_prop = Run.__mapper__.relationships["steps"]
_prop.lazy = "select"
_prop.strategy_key = (("lazy", "select"),)
_prop.strategy = _prop._get_strategy(_prop.strategy_key)
