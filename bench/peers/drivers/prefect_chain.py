"""Runs inside the Prefect virtualenv: a flow of LINKS no-op tasks, called as a Prefect user
calls a flow on one machine.

    PREFECT_HOME=... python prefect_chain.py LINKS

With no ``PREFECT_API_URL``, Prefect 3 starts its ephemeral API server (a subprocess on
loopback) on the first flow call, with the database its settings name: SQLite under
``PREFECT_HOME`` by default, or ``PREFECT_SERVER_DATABASE_CONNECTION_URL``. The first call is
the warm-up. The timed span is the flow call, from its start to its return with its final
state, which the flow run reports to the server before it returns.
"""

from __future__ import annotations

import sys
from importlib.metadata import version

from peer_protocol import serve, timed
from prefect import flow, task
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL


@task
def noop() -> None:
    """A link of the chain."""


@flow
def chain(links: int) -> int:
    for _ in range(links):
        noop()
    return links


def run(links: int) -> str:
    state = chain(links, return_state=True)
    return str(state.type.value)


def main() -> None:
    links = int(sys.argv[1])
    run(2)
    database = PREFECT_SERVER_DATABASE_CONNECTION_URL.value() or ""
    serve(
        {
            "versions": {"prefect": version("prefect")},
            "server": "ephemeral" if not PREFECT_API_URL.value() else PREFECT_API_URL.value(),
            "database": database.split(":", 1)[0].split("+", 1)[0],
        },
        {"flow": lambda: timed(lambda: run(links))},
    )


if __name__ == "__main__":
    main()
