"""Runs inside the DBOS virtualenv: a workflow of LINKS no-op durable steps, two ways.

    python dbos_chain.py SYSTEM_DATABASE_URL LINKS

* ``queue``: enqueued on a DBOS queue (registered with DBOS's defaults) and awaited with
  ``get_result``, polled every 10 ms like the engine's run row; the process's own queue
  thread dequeues and runs it, as in a one-process DBOS application.
* ``call``: the workflow function called in-process, which runs it at once in the caller.

Each step is a ``@DBOS.step`` that returns at once; DBOS checkpoints its output in the
system database before the next one starts. The timed span ends when the workflow's status
is ``SUCCESS``; the status is read back after the clock stops.
"""

from __future__ import annotations

import sys
import uuid
from importlib.metadata import version

from dbos import DBOS, SetWorkflowID
from peer_protocol import serve, timed

QUEUE = "bench-chain"
#: How often the waiter reads the workflow's status: the engine's waiter reads its run's
#: row as often (``bench.engine.wait_terminal``).
AWAIT_POLL_S = 0.01


@DBOS.step()
def noop() -> None:
    """A link of the chain."""


@DBOS.workflow()
def chain(links: int) -> int:
    for _ in range(links):
        noop()
    return links


def main() -> None:
    url, links = sys.argv[1], int(sys.argv[2])
    DBOS(config={"name": "orch-bench", "system_database_url": url, "run_admin_server": False})
    DBOS.launch()
    queue = DBOS.register_queue(QUEUE)

    def through_queue(count: int) -> str:
        handle = queue.enqueue(chain, count)
        handle.get_result(polling_interval_sec=AWAIT_POLL_S)
        return str(handle.get_status().status)

    def in_process(count: int) -> str:
        workflow_id = uuid.uuid4().hex
        with SetWorkflowID(workflow_id):
            chain(count)
        return str(DBOS.retrieve_workflow(workflow_id).get_status().status)

    for warm in (through_queue, in_process):  # imports, connections, the queue's thread
        warm(2)
    try:
        serve(
            {
                "versions": {"dbos": version("dbos")},
                "queue_polling_interval_s": queue.polling_interval_sec,
                "await_polling_interval_s": AWAIT_POLL_S,
            },
            {
                "queue": lambda: timed(lambda: through_queue(links)),
                "call": lambda: timed(lambda: in_process(links)),
            },
        )
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
