"""A small Flask app that launches and follows workflow runs through the Python API.

It runs beside a worker that uses the same ``ORCH_DATABASE_URL`` and ``ORCH_BROKER_URL``::

    .venv/bin/pip install flask
    FLASK_APP_TOKENS=tok-acme=acme .venv/bin/flask --app examples/flask_app.py run --port 5055

Routes (JSON in, JSON out; errors as ``{"error": {"code", "message", "field"}}``):

* ``POST /runs`` ``{"workflow": NAME, "args": {...}}``; header ``Idempotency-Key`` (optional;
  a repeated key returns the same run, 201 as for a new one, as the HTTP API does)
* ``GET /runs`` (``?status=``, ``?limit=``), ``GET /runs/ID``, ``GET /runs/ID/explain``
* ``POST /runs/ID/cancel`` (``{"graceful": true}`` to only request it)
* ``POST /runs/ID/answer`` ``{"step": STEP_ID, "value": ANY_JSON}``

Two decisions a real app should keep:

* The owner comes from authentication, never from the request body. Here a bearer token maps
  to an owner (``FLASK_APP_TOKENS=token=owner,...``); put your own login in its place.
* Clients pick a workflow by name from a catalog the server holds. They never send a
  workflow: a workflow names providers and the URLs they call.
"""

from __future__ import annotations

import hmac
import json
import os
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, jsonify, request

from orchestration.core.errors import (
    BrokerUnavailable,
    ConflictError,
    DatabaseNotReady,
    IdempotencyConflict,
    LimitExceeded,
    OrchestrationError,
    RunNotFound,
    ValidationError,
)
from orchestration.service import Orchestrator
from orchestration.workflows import load_file

EXAMPLES = Path(__file__).resolve().parents[1] / "orchestration" / "examples"

#: The workflows clients may launch, by name.
WORKFLOWS: dict[str, Any] = {
    "research": load_file(EXAMPLES / "research.yaml"),
    "endless": load_file(EXAMPLES / "endless.yaml"),
}

#: HTTP status per error class; the first match wins, so subclasses come first.
STATUS: tuple[tuple[type[OrchestrationError], int], ...] = (
    (LimitExceeded, 422),  # well-formed but over a configured limit: retry later or shrink
    (ValidationError, 400),  # bad input; ``field`` names it; nothing was written
    (RunNotFound, 404),  # also another owner's run
    (IdempotencyConflict, 409),  # the Idempotency-Key was used with other input
    (ConflictError, 409),  # valid, but not now (answer a run that is not parked, ...)
    (DatabaseNotReady, 503),  # run `orchestration db upgrade`
    (BrokerUnavailable, 503),  # the run is saved (its id in the message); sent when it is back
)


def _error(status: int, code: str, message: str, field: str | None = None) -> Response:
    response = jsonify({"error": {"code": code, "message": message, "field": field}})
    response.status_code = status
    return response


def _tokens_from_env() -> dict[str, str]:
    pairs = (item.split("=", 1) for item in os.environ.get("FLASK_APP_TOKENS", "").split(","))
    return {token: owner for token, owner in (p for p in pairs if len(p) == 2) if token}


def _record(record: Any) -> dict[str, Any]:
    return dict(record.model_dump(mode="json"))


def create_app(
    orchestrator: Orchestrator | None = None, *, tokens: dict[str, str] | None = None
) -> Flask:
    """The app over ``orchestrator`` (default :meth:`Orchestrator.from_env`, which raises
    ``ConfigurationError`` or ``DatabaseNotReady`` at start-up rather than at the first
    request)."""
    orch = orchestrator or Orchestrator.from_env()
    owners = _tokens_from_env() if tokens is None else tokens
    app = Flask(__name__)

    @app.before_request
    def authenticate() -> Response | None:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        for token, owner in owners.items():
            if given and hmac.compare_digest(given, token):
                g.owner = owner
                return None
        return _error(401, "unauthorized", "send Authorization: Bearer <token>")

    @app.errorhandler(OrchestrationError)
    def orchestration_error(exc: OrchestrationError) -> Response:
        status = next((code for cls, code in STATUS if isinstance(exc, cls)), 500)
        field = exc.field if isinstance(exc, ValidationError) else None
        return _error(status, exc.code, str(exc), field)

    def body() -> dict[str, Any]:
        data = request.get_json(silent=True)
        if data is None and not request.get_data():
            return {}
        if not isinstance(data, dict):
            raise ValidationError("body", "must be a JSON object")
        return data

    @app.post("/runs")
    def launch() -> tuple[Response, int]:
        data = body()
        name = data.get("workflow")
        if name not in WORKFLOWS:
            raise ValidationError("workflow", f"must be one of {sorted(WORKFLOWS)}")
        record = orch.launch(
            WORKFLOWS[name],
            data.get("args"),
            owner=g.owner,
            request_id=request.headers.get("Idempotency-Key"),
        )
        # The same Idempotency-Key with the same input returns the run it made before, with
        # 201 again: the HTTP API (``orchestration api``) answers the same way.
        return jsonify(_record(record)), 201

    @app.get("/runs")
    def runs() -> Response:
        try:
            limit = int(request.args.get("limit", "50"))
        except ValueError:
            raise ValidationError("limit", "must be an integer") from None
        records = orch.list(owner=g.owner, status=request.args.get("status"), limit=limit)
        return jsonify(
            {
                "runs": [
                    {
                        "id": r.id,
                        "workflow": r.workflow_name,
                        "status": r.status,
                        "health": r.health,
                        "created_at": r.created_at.isoformat(),
                        "deadline_at": r.deadline_at.isoformat() if r.deadline_at else None,
                    }
                    for r in records
                ]
            }
        )

    @app.get("/runs/<run_id>")
    def show(run_id: str) -> Response:
        return jsonify(_record(orch.get(run_id, owner=g.owner)))

    @app.get("/runs/<run_id>/explain")
    def explain(run_id: str) -> Response:
        summary = orch.explain(run_id, owner=g.owner)
        return jsonify(
            {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in summary.items()}
        )

    @app.post("/runs/<run_id>/cancel")
    def cancel(run_id: str) -> Response:
        graceful = body().get("graceful", False)
        if not isinstance(graceful, bool):
            raise ValidationError("graceful", "must be true or false")
        # Without graceful this returns once the run is terminal (at most about one
        # ORCH_PROVIDER_TIMEOUT, the bound on the provider's cancel call).
        return jsonify(_record(orch.cancel(run_id, owner=g.owner, graceful=graceful)))

    @app.post("/runs/<run_id>/answer")
    def answer(run_id: str) -> Response:
        data = body()
        step = data.get("step")
        if not isinstance(step, str):
            raise ValidationError("step", "must be the parked step's id")
        if "value" not in data:
            raise ValidationError("value", "is required (any JSON value)")
        try:
            # Python's JSON parser accepts NaN and Infinity; the engine stores strict JSON.
            json.dumps(data["value"], allow_nan=False)
        except ValueError:
            raise ValidationError("value", "must be strict JSON (no NaN or Infinity)") from None
        return jsonify(_record(orch.answer(run_id, step, data["value"], owner=g.owner)))

    return app
