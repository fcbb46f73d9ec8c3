"""The optional webhook effect: a finished step is POSTed to ``ORCH_WEBHOOK_URL`` through the
outbox, and a failing webhook under ``ORCH_EFFECT_POLICY=continue`` never leaves the run
``waiting``."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from tests.support.runs import finished

pytestmark = pytest.mark.integration

RECEIVED: list[dict[str, Any]] = []
#: Step ids whose notification the receiver refuses (HTTP 503), to exhaust the effect.
REFUSE = {"refused"}


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RECEIVED.append(body)
        self.send_response(503 if body["step_id"] in REFUSE else 204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return


def _serve() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadingHTTPServer(("127.0.0.1", port), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}/hook"


STACK_SETTINGS = {
    "ORCH_WEBHOOK_URL": _serve(),
    "ORCH_WEBHOOK_TIMEOUT": "2",
    "ORCH_EFFECT_POLICY": "continue",
}


def flow(step_id: str) -> dict[str, Any]:
    return {
        "name": "hooked",
        "steps": [
            {
                "id": step_id,
                "provider": "scripted",
                "task": "go",
                "poll_interval": 0.1,
                "max_poll_interval": 0.5,
                "with": {"states": [["completed"]], "output": {"answer": 42}},
            }
        ],
    }


def test_a_finished_step_is_posted_to_the_webhook(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow("notified"), owner=owner)
    done = finished(orch, run.id, owner)
    assert done.status == "completed"
    posted = [body for body in RECEIVED if body["run_id"] == run.id]
    assert posted == [
        {
            "run_id": run.id,
            "owner": owner,
            "step_id": "notified",
            "attempt": 1,
            "output": {"answer": 42},
        }
    ]


def test_an_exhausted_webhook_under_continue_completes_with_the_failure_recorded(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(flow("refused"), owner=owner)
    done = finished(orch, run.id, owner)
    assert (done.status, done.stop_reason) == ("completed", "completed")
    assert "webhook effect failed 3 times" in (done.steps[0].error or "")
    assert len([body for body in RECEIVED if body["run_id"] == run.id]) == 3
