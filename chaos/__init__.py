"""The chaos suite (issue 6): real services, real worker processes, injected faults.

``python -m chaos`` launches a mixed population of runs against real Redis or RabbitMQ and a
fresh PostgreSQL database, with two prefork workers and a beat, and injects faults: workers
SIGKILLed at exact points (a provider start, a countdown, a transition, an effect, a cancel),
workers SIGSTOPped past the heartbeat timeout and woken, the broker restarted, every database
connection dropped, cancel storms, cancels racing completion and duplicate deliveries. It then
checks the engine's promises from the database and exits non-zero when one is broken.

Modules: :mod:`chaos.services` (broker and database), :mod:`chaos.fleet` (workers and beat),
:mod:`chaos.population` (the runs), :mod:`chaos.driver` (the caller side),
:mod:`chaos.traps` and :mod:`chaos.faults` (the faults), :mod:`chaos.audit` (the figures),
:mod:`chaos.report` and :mod:`chaos.runner`. ``docs/reliability.md`` explains the design.
"""
