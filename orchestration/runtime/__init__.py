"""Runtime adapters: the Celery app's configuration, the task queue and the executor.

The domain (``orchestration.*`` outside ``runtime``, ``api``, ``cli`` and ``demo``) never
imports Celery: it returns :class:`orchestration.core.followups.Followups`, and the executor here
carries them out after the transaction commits.
"""
