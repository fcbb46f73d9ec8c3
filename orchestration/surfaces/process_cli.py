"""CLI commands that start the engine's processes: ``orchestration worker`` and ``beat``.

Each checks first that its database (reachable, schema at head) and its broker can serve it,
and otherwise prints one line and exits with status 2 before Celery starts
(:func:`orchestration.runtime.readiness.refuse_unfit`; ``celery -A tasks worker`` gets the
same check from Celery's start-up signals in ``tasks``).
"""

from __future__ import annotations

import typer

from orchestration.core.settings import get_settings

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _start(process: str, *args: str) -> None:
    from orchestration.runtime.processes import celery_here
    from orchestration.runtime.readiness import refuse_unfit

    refuse_unfit(get_settings(), process)
    celery_here(process, *args)


def worker(ctx: typer.Context) -> None:
    """Start a worker (prefork); more arguments go to 'celery worker'.

    It checks its database and broker first: one line and exit 2 if either is wrong."""
    _start("worker", "--loglevel", "INFO", "-E", *ctx.args)


def beat(ctx: typer.Context) -> None:
    """Start the beat (run exactly one); more arguments go to Celery.

    It checks its database and broker first: one line and exit 2 if either is wrong."""
    _start("beat", "--loglevel", "INFO", *ctx.args)


def register(app: typer.Typer) -> None:
    """Add ``worker`` and ``beat`` to the main CLI."""
    app.command(context_settings=_PASSTHROUGH)(worker)
    app.command(context_settings=_PASSTHROUGH)(beat)
