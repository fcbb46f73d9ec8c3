"""Celery app and task bodies. Task bodies are thin: parse ids, call ``orchestration``."""

from __future__ import annotations

from tasks.celery_app import app

__all__ = ["app"]
