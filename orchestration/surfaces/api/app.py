"""The FastAPI app: ``/runs``, ``/workflows``, ``/schedules`` and ``/operator`` (JSON, bearer
tokens), ``/dashboard`` (HTML, cookie), ``/healthz`` and ``/metrics`` (unauthenticated; they
hold counts, never run contents).

``create_app(orchestrator)`` takes the :class:`Orchestrator` so tests and embedding apps pass
their own; ``orchestration api`` builds one from ``ORCH_*`` (see ``docs/api.md``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from orchestration.runtime.liveness import check
from orchestration.service import Orchestrator
from orchestration.surfaces.api import (
    agents,
    artifacts,
    dashboard,
    deletions,
    errors,
    fleet_page,
    launch_page,
    metrics,
    operator,
    owner_suspensions,
    runs,
    schedules,
    schedules_page,
    signin,
    tokens,
    workflows,
)
from orchestration.surfaces.api.auth import orchestrator as app_orchestrator
from orchestration.surfaces.api.headers import SecurityHeaders
from orchestration.surfaces.api.limits import BodyLimit, max_body_bytes

#: Error responses every authenticated route may give, documented once in the schema.
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": ["string", "null"]},
                "run_id": {"type": "string"},
            },
        }
    },
}
_ERROR_RESPONSES = {
    "400": "validation_error: bad input; `field` names it",
    "401": "unauthorized: missing, unknown or revoked token",
    "404": "not_found: no such run for this owner",
    "409": "idempotency_conflict or conflict",
    "413": "body_too_large",
    "422": "limit_exceeded: over a configured limit",
    "503": "database_not_ready, or broker_unavailable: the run (`run_id`) is saved, not sent",
}


def create_app(orchestrator: Orchestrator | None = None, *, max_body: int | None = None) -> FastAPI:
    """The app over ``orchestrator`` (default: :meth:`Orchestrator.from_env`).

    ``max_body`` overrides ``ORCH_API_MAX_BODY_BYTES``. Raises
    :class:`~orchestration.core.errors.DatabaseNotReady` when the schema is behind.
    """
    orch = orchestrator or Orchestrator.from_env()
    tokens.check_ready(orch.settings.database_url)
    app = FastAPI(
        title="orchestration",
        summary="Launch, watch and cancel AI-agent workflow runs; every run ends.",
        version="1",
        # Swagger UI and ReDoc load their assets from a CDN; the schema is served as JSON only.
        docs_url=None,
        redoc_url=None,
    )
    app.state.orchestrator = orch
    app.state.metrics = metrics.registry(orch.settings, orch.clock)
    errors.install(app)
    app.add_middleware(BodyLimit, limit=max_body or max_body_bytes())
    # Added last, so outermost: a refused body's 413 carries the headers too.
    app.add_middleware(SecurityHeaders)
    app.include_router(runs.router)
    app.include_router(artifacts.router)
    app.include_router(deletions.router)
    app.include_router(workflows.router)
    app.include_router(agents.router)
    app.include_router(schedules.router)
    app.include_router(operator.router)
    app.include_router(owner_suspensions.router)
    app.include_router(dashboard.router)
    app.include_router(fleet_page.router)
    app.include_router(launch_page.router)
    app.include_router(schedules_page.router)
    app.include_router(signin.router)
    app.mount("/dashboard/static", StaticFiles(directory=dashboard.STATIC), name="static")
    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["operations"])
    app.add_api_route(
        "/metrics", metrics_text, methods=["GET"], tags=["operations"], response_class=Response
    )
    app.add_api_route("/", root, methods=["GET"], include_in_schema=False)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def healthz(request: Request) -> JSONResponse:
    """Database, broker and sweeper liveness: 200 when all are up, else 503."""
    report = check(app_orchestrator(request).settings)
    return JSONResponse(report, status_code=200 if report["ok"] else 503)


async def metrics_text(request: Request) -> Response:
    """Prometheus text exposition (see ``docs/api.md`` for the metrics)."""
    body = await run_in_threadpool(generate_latest, request.app.state.metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def root() -> RedirectResponse:
    return RedirectResponse("/dashboard", status_code=307)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the error shape on every ``/runs`` operation."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    schema["components"].setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, operations in schema["paths"].items():
        if not path.startswith("/runs"):
            continue
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for code, description in _ERROR_RESPONSES.items():
                responses.setdefault(code, {"description": description, **ref})
            # FastAPI's own 422 schema describes its validation errors, which this API
            # answers with 400; 422 here means limit_exceeded.
            responses["422"] = {"description": _ERROR_RESPONSES["422"], **ref}
    app.openapi_schema = schema
    return schema
