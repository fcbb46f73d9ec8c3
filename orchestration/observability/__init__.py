"""What an operator sees of the engine from outside: JSON logs and OpenTelemetry traces.

Both read one context (:mod:`.context`): the run, step, attempt and task the code is working
on, set where that is known (a step task, a sweeper action, an API call). Like dramatiq's
middleware, every hook does nothing until configured (``ORCH_LOG_FORMAT``,
``ORCH_OTEL_ENDPOINT``), and the domain calls them without importing Celery.
"""
