"""The HTTP API over real HTTP against a real prefork worker: auth, owner isolation,
idempotent launch, cancel, answer, validation and body limits, /healthz, the OpenAPI schema
and /metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestration.runtime.processes import ManagedProcess
from tests.conftest import wait_for
from tests.e2e.conftest import ApiServer, make_token, scripted
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

LONG = [["running"]]


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _error(response: httpx.Response, status: int, code: str, field: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["message"]
    if field is not None:
        assert error["field"] == field, error


def _until(client: httpx.Client, run_id: str, predicate: Any, what: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        record = _ok(client.get(f"/runs/{run_id}"))
        return record if predicate(record) else None

    result: dict[str, Any] = wait_for(check, 20, interval=0.1, what=what)
    return result


def _cli(stack: Stack, *args: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("orchestration")), *args],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_missing_wrong_and_revoked_tokens_are_401(api: ApiServer, stack: Stack, owner: str) -> None:
    with api.client() as anonymous:
        response = anonymous.get("/runs")
        _error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    with api.client("orch_not-a-real-token") as wrong:
        _error(wrong.get("/runs"), 401, "unauthorized")
    with api.client(**{"Authorization": "Basic dXNlcjpwYXNz"}) as basic:
        _error(basic.get("/runs"), 401, "unauthorized")
    # The CLI prints the token once; the database holds only its hash.
    token = _cli(stack, "tokens", "create", "--owner", owner, "--name", "e2e")
    assert token.startswith("orch_") and token not in _cli(stack, "tokens", "list")
    with api.client(token) as client:
        assert _ok(client.get("/runs")) == {"runs": [], "next_cursor": None}
        _cli(stack, "tokens", "revoke", token)
        _error(client.get("/runs"), 401, "unauthorized")


def test_another_owners_run_is_not_found_everywhere(
    api: ApiServer, worker: ManagedProcess, stack: Stack, owner: str, token: str
) -> None:
    intruder = make_token(stack, owner + "-intruder")
    with api.client(token) as mine, api.client(intruder) as theirs:
        run = _ok(mine.post("/runs", json={"workflow": scripted(LONG)}), 201)
        path = f"/runs/{run['id']}"
        for response in (
            theirs.get(path),
            theirs.post(path + "/cancel"),
            theirs.post(path + "/answer", json={"step": "s1", "value": 1}),
            theirs.get(path + "/explain"),
            theirs.get(path + "/events"),
        ):
            _error(response, 404, "not_found")
            assert "go" not in response.text and owner not in response.text
        assert _ok(theirs.get("/runs"))["runs"] == []
        assert [r["id"] for r in _ok(mine.get("/runs"))["runs"]] == [run["id"]]
        assert _ok(mine.get(path))["status"] != "cancelled"
        _ok(mine.post(path + "/cancel"))


def test_list_pages_and_filters(
    api: ApiServer, worker: ManagedProcess, owner: str, token: str
) -> None:
    with api.client(token) as client:
        ids = [
            _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)["id"]
            for _ in range(3)
        ]
        _ok(client.post(f"/runs/{ids[0]}/cancel"))
        first = _ok(client.get("/runs", params={"limit": 2}))
        assert [r["id"] for r in first["runs"]] == ids[:0:-1] and first["next_cursor"]
        second = _ok(client.get("/runs", params={"limit": 2, "cursor": first["next_cursor"]}))
        assert [r["id"] for r in second["runs"]] == [ids[0]] and second["next_cursor"] is None
        ended = _ok(client.get("/runs", params={"health": "ended"}))["runs"]
        assert [r["id"] for r in ended] == [ids[0]]
        live = _ok(client.get("/runs", params={"status": "cancelled"}))["runs"]
        assert [r["id"] for r in live] == [ids[0]]
        _error(
            client.get("/runs", params={"cursor": "garbage!"}), 400, "validation_error", "cursor"
        )
        for run_id in ids[1:]:
            _ok(client.post(f"/runs/{run_id}/cancel"))


def test_idempotency_key_gives_one_run_and_conflicts(
    api: ApiServer, worker: ManagedProcess, token: str
) -> None:
    body = {"workflow": scripted([["completed"]]), "args": {"x": 1}}
    with api.client(token, **{"Idempotency-Key": "launch-1"}) as client:
        first = _ok(client.post("/runs", json=body), 201)
        again = _ok(client.post("/runs", json=body), 201)
        assert again["id"] == first["id"] and first["request_id"] == "launch-1"
        changed = client.post("/runs", json={**body, "args": {"x": 2}})
        _error(changed, 409, "idempotency_conflict")
        mismatch = client.post("/runs", json={**body, "request_id": "other"})
        _error(mismatch, 400, "validation_error", "request_id")
        assert len(_ok(client.get("/runs"))["runs"]) == 1


def test_cancel_returns_the_terminal_record(
    api: ApiServer, worker: ManagedProcess, token: str
) -> None:
    with api.client(token) as client:
        run = _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)
        _until(client, run["id"], lambda r: r["steps"][0]["polls"] >= 2, "polling")
        record = _ok(client.post(f"/runs/{run['id']}/cancel"))
        assert (record["status"], record["stop_reason"]) == ("cancelled", "cancel_requested")
        assert record["steps"][0]["status"] == "cancelled"
        graceful = _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)
        _until(client, graceful["id"], lambda r: r["status"] == "running", "running")
        flagged = _ok(client.post(f"/runs/{graceful['id']}/cancel", params={"graceful": True}))
        assert flagged["status"] == "cancelling" and flagged["cancel_requested_at"]
        _until(client, graceful["id"], lambda r: r["status"] == "cancelled", "graceful cancel")
        events = _ok(client.get(f"/runs/{graceful['id']}/events"))
        assert [e["to"] for e in events if e["step_id"] is None][-2:] == [
            "cancelling",
            "cancelled",
        ]
        assert {"from", "to", "cause", "at", "stop_reason", "step_id"} <= set(events[0])


def test_answer_resumes_a_human_park(api: ApiServer, worker: ManagedProcess, token: str) -> None:
    flow = scripted([["running", 0.2], ["input_required"]], prompt="which colour?")
    with api.client(token) as client:
        run = _ok(client.post("/runs", json={"workflow": flow}), 201)
        parked = _until(client, run["id"], lambda r: r["park_reason"] == "human", "human park")
        assert parked["status"] == "parked" and parked["steps"][0]["prompt"] == "which colour?"
        explained = _ok(client.get(f"/runs/{run['id']}/explain"))
        assert "human" in explained["text"] and explained["deadline_at"]
        _error(
            client.post(f"/runs/{run['id']}/answer", json={"step": "nope", "value": 1}),
            400,
            "validation_error",
            "step",
        )
        resumed = _ok(
            client.post(f"/runs/{run['id']}/answer", json={"step": "s1", "value": "blue"})
        )
        assert resumed["status"] == "running"
        done = _until(client, run["id"], lambda r: r["status"] == "completed", "completed")
        assert done["result"] == "blue"
        again = client.post(f"/runs/{run['id']}/answer", json={"step": "s1", "value": "red"})
        _error(again, 409, "conflict")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"workflow": {"name": "x", "steps": [{"id": "bad id", "provider": "scripted"}]}},
            "steps[0].id",
        ),
        ({"workflow": {"name": "x", "steps": []}}, "steps"),
        ({"workflow": scripted([["completed"]]), "args": [1, 2]}, "args"),
        ({"workflow": "not a mapping"}, "workflow"),
        ({"args": {}}, "workflow"),
        ({"workflow": scripted([["completed"]]), "on_conflict": "sometimes"}, "on_conflict"),
        ({"workflow": scripted([["completed"]]), "surprise": 1}, "surprise"),
        ({"workflow": scripted([["completed"]]), "request_id": "has space"}, "request_id"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    api: ApiServer, token: str, body: dict[str, Any], field: str
) -> None:
    with api.client(token) as client:
        _error(client.post("/runs", json=body), 400, "validation_error", field)
        assert _ok(client.get("/runs"))["runs"] == []


def test_bad_queries_and_json_are_400(api: ApiServer, token: str) -> None:
    with api.client(token) as client:
        _error(client.get("/runs", params={"status": "lost"}), 400, "validation_error", "status")
        _error(client.get("/runs", params={"health": "meh"}), 400, "validation_error", "health")
        _error(client.get("/runs", params={"limit": 0}), 400, "validation_error", "limit")
        broken = client.post(
            "/runs", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        _error(broken, 400, "validation_error", "body")


def test_body_limits(api: ApiServer, token: str) -> None:
    with api.client(token) as client:
        big = {"workflow": scripted([["completed"]]), "args": {"blob": "x" * 300_000}}
        _error(client.post("/runs", json=big), 413, "body_too_large")

        def chunks() -> Any:
            for _ in range(40):
                yield b"x" * 8192

        _error(client.post("/runs", content=chunks()), 413, "body_too_large")
        # Under the body limit but over ORCH_MAX_ARGS_BYTES (64 KiB): limit_exceeded.
        over = {"workflow": scripted([["completed"]]), "args": {"blob": "x" * 70_000}}
        _error(client.post("/runs", json=over), 422, "limit_exceeded", "args")
        assert _ok(client.get("/runs"))["runs"] == []


def test_healthz_reports_database_broker_and_sweeper(
    api: ApiServer, worker: ManagedProcess, beat: ManagedProcess
) -> None:
    with api.client() as client:
        report = wait_for(
            lambda: (r := client.get("/healthz")).status_code == 200 and r.json(),
            20,
            what="healthz 200",
        )
    assert set(report["checks"]) == {"database", "broker", "sweeper"}
    assert all(part["ok"] for part in report["checks"].values())


def test_openapi_schema_documents_routes_and_bearer_auth(api: ApiServer) -> None:
    with api.client() as client:
        schema = _ok(client.get("/openapi.json"))
    paths = schema["paths"]
    for path, methods in {
        "/runs": {"get", "post"},
        "/runs/{run_id}": {"get"},
        "/runs/{run_id}/cancel": {"post"},
        "/runs/{run_id}/answer": {"post"},
        "/runs/{run_id}/explain": {"get"},
        "/runs/{run_id}/events": {"get"},
        "/healthz": {"get"},
        "/metrics": {"get"},
    }.items():
        assert methods <= set(paths[path]), path
    assert not any(path.startswith("/dashboard") for path in paths)
    scheme = schema["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    launch = paths["/runs"]["post"]
    assert launch["security"] == [{"bearerAuth": []}]
    assert {"400", "401", "409", "413", "422"} <= set(launch["responses"])
    assert "security" not in paths["/healthz"]["get"]
    params = {p["name"] for p in paths["/runs"]["get"]["parameters"]}
    assert {"status", "health", "limit", "cursor", "before"} <= params


def test_metrics_parse_and_nothing_is_past_its_deadline(
    api: ApiServer, worker: ManagedProcess, beat: ManagedProcess, token: str
) -> None:
    with api.client(token) as client:
        run = _ok(client.post("/runs", json={"workflow": scripted(LONG)}), 201)
        _until(client, run["id"], lambda r: r["status"] == "running", "running")
        _ok(client.post(f"/runs/{run['id']}/cancel"))
        # The beat may be younger than this test (test order is random): its first pass.
        wait_for(
            lambda: (
                "orchestration_sweeper_last_pass_age_seconds +Inf"
                not in client.get("/metrics").text
            ),
            30,
            what="the sweeper's first pass",
        )
        text = client.get("/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    samples = {
        family: {tuple(sorted(s.labels.items())): s.value for s in families[family].samples}
        for family in families
    }
    assert samples["orchestration_metrics_database_up"][()] == 1
    assert samples["orchestration_runs_past_deadline"][()] == 0
    assert samples["orchestration_runs"][(("health", "ended"), ("status", "cancelled"))] >= 1
    stops = samples["orchestration_run_terminal_transitions"]
    assert stops[(("status", "cancelled"), ("stop_reason", "cancel_requested"))] >= 1
    latency = {
        s.name: s.value
        for s in families["orchestration_cancel_to_terminal_seconds"].samples
        if not s.labels or s.labels.get("le") == "+Inf"
    }
    assert latency["orchestration_cancel_to_terminal_seconds_count"] >= 1
    assert 0 <= samples["orchestration_sweeper_last_pass_age_seconds"][()] < 30
    assert "orchestration_provider_call_seconds" in families
