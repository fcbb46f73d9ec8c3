"""The director worker's app, with the flags the engine's worker runs with.

Run by the director virtualenv's Celery as ``-A bench_director_app:cel`` from a home folder
that holds this file; director's own config only sets the broker and result backend.
"""

from director._auto import cel

cel.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
)
