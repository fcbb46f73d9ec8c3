"""orchestration: a Celery-based backend that runs AI-agent workflow runs and guarantees that
every run ends. The Python API for web apps is :mod:`orchestration.service`."""

from __future__ import annotations

__version__ = "0.1.0"
