"""E2E fixtures: the integration deployment (``stack``, ``worker``, ``beat``), the HTTP app
served by a real uvicorn on a free loopback port, and API tokens made the way the CLI does.

The app runs in a thread of the test process (over the stack's own ``Orchestrator``), but is
reached only over TCP, as any client would.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from orchestration.core.db import session_scope, utcnow
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from tests.conftest import wait_for
from tests.integration import conftest as integration
from tests.integration.conftest import Stack

# The integration tier's fixtures, re-exported: each e2e module is an isolated deployment too.
broker_url = integration.broker_url
stack = integration.stack
worker = integration.worker
beat = integration.beat
orch = integration.orch
owner = integration.owner


@dataclass
class ApiServer:
    """The served app: its base URL, and a client maker."""

    url: str

    def client(self, token: str | None = None, **headers: str) -> httpx.Client:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[ApiServer]:
    """uvicorn serving ``create_app(stack.orchestrator())`` on 127.0.0.1:<free port>."""
    app = create_app(stack.orchestrator())
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [listener]}, name="uvicorn", daemon=True
    )
    thread.start()
    wait_for(lambda: server.started, 15, what="uvicorn started")
    yield ApiServer(f"http://127.0.0.1:{port}")
    server.should_exit = True
    thread.join(15)
    listener.close()


def make_token(stack: Stack, owner: str, name: str | None = None) -> str:
    """A fresh token for ``owner`` (what ``orchestration tokens create`` stores)."""
    with session_scope(stack.settings.database_url) as session:
        return tokens.create(session, owner, name, now=utcnow())


@pytest.fixture()
def token(stack: Stack, owner: str) -> str:
    """A token for this test's owner."""
    return make_token(stack, owner)


def scripted(
    states: list[list[Any]], *, step_id: str = "s1", name: str = "t", **options: Any
) -> dict[str, Any]:
    """A one-step workflow on the scripted provider, polling every 0.1-0.5 s."""
    return {
        "name": name,
        "steps": [
            {
                "id": step_id,
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.1,
                "max_poll_interval": 0.5,
                "with": {"states": states, **options},
            }
        ],
    }
