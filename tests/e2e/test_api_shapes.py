"""Retries, approvals and branches over real HTTP (issue 12): the run JSON lists every attempt
with its error and the run page shows them; an approval is decided once through its route, and
the run page offers its buttons; a fan-out lists its branches, and its page and a branch's link
to each other."""

from __future__ import annotations

import pytest

from orchestration.runtime.processes import ManagedProcess
from tests.conftest import wait_for
from tests.e2e.conftest import ApiServer, scripted

pytestmark = pytest.mark.e2e


def test_the_run_json_and_the_run_page_show_each_attempt(
    api: ApiServer, worker: ManagedProcess, token: str
) -> None:
    flow = scripted([["completed"]], attempt_states=[[["failed"]]], error="model overloaded")
    flow["steps"][0]["retry"] = {"attempts": 2, "backoff": 0.2}
    with api.client(token) as client:
        created = client.post("/runs", json={"workflow": flow})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        done = wait_for(
            lambda: (r := client.get(f"/runs/{run_id}").json())["status"] == "completed" and r,
            30,
            interval=0.1,
            what="the retried run completed",
        )
        page = client.get(f"/dashboard/runs/{run_id}")
    step = done["steps"][0]
    assert (step["attempt"], step["status"], step["retry_at"]) == (2, "completed", None)
    assert [(a["attempt"], a["reason"], a["error"]) for a in step["past_attempts"]] == [
        (1, "failed", "model overloaded")
    ]
    assert page.status_code == 200, page.text
    assert "attempt 1 ended (failed)" in page.text and "model overloaded" in page.text


def test_an_approval_is_decided_once_through_its_route(
    api: ApiServer, worker: ManagedProcess, token: str
) -> None:
    flow = {
        "name": "approve",
        "steps": [{"id": "review", "approval": {"prompt": "Ship it?", "expires_in": 300}}],
    }
    with api.client(token) as client:
        run_id = client.post("/runs", json={"workflow": flow}).json()["id"]
        wait_for(
            lambda: client.get(f"/runs/{run_id}").json()["park_reason"] == "approval",
            30,
            interval=0.1,
            what="the run parked for its approval",
        )
        page = client.get(f"/dashboard/runs/{run_id}")
        route = f"/runs/{run_id}/steps/review/approval"
        wrong = client.post(route, json={"decision": "maybe"})
        decided = client.post(route, json={"decision": "reject", "comment": "not today"})
        again = client.post(route, json={"decision": "approve"})
    assert 'id="approve"' in page.text and "Ship it?" in page.text
    assert wrong.status_code == 400 and "decision" in wrong.text, wrong.text
    assert decided.status_code == 200, decided.text
    record = decided.json()
    assert (record["status"], record["stop_reason"]) == ("failed", "approval_rejected")
    assert record["steps"][0]["output"]["comment"] == "not today"
    assert again.status_code == 409, again.text
    assert "not waiting for a decision" in again.text


def test_the_run_json_lists_branches_and_the_pages_link_parent_and_branch(
    api: ApiServer, worker: ManagedProcess, token: str
) -> None:
    branch = scripted([["completed"]])["steps"][0]
    branch.pop("id")
    branch["task"] = "about {{ item }}"
    flow = {
        "name": "fan",
        "steps": [
            {"id": "fan", "for_each": "{{ args.items }}", "max_concurrency": 1, "step": branch}
        ],
    }
    with api.client(token) as client:
        created = client.post("/runs", json={"workflow": flow, "args": {"items": ["a", "b"]}})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        done = wait_for(
            lambda: (r := client.get(f"/runs/{run_id}").json())["status"] == "completed" and r,
            30,
            interval=0.1,
            what="the fan-out completed",
        )
        branches = done["steps"][0]["branches"]
        page = client.get(f"/dashboard/runs/{run_id}")
        child = client.get(f"/runs/{branches[1]['run_id']}").json()
        child_page = client.get(f"/dashboard/runs/{branches[1]['run_id']}")
        refused = client.post("/runs", json={"workflow": flow, "args": {"items": "a"}})
    assert done["result"] == ["about a", "about b"]
    assert [(b["id"], b["index"], b["status"], b["output"]) for b in branches] == [
        ("0", 0, "completed", "about a"),
        ("1", 1, "completed", "about b"),
    ]
    assert (child["parent_run_id"], child["parent_step"], child["branch_key"]) == (run_id, 0, "1")
    assert (
        page.status_code == 200 and f'href="/dashboard/runs/{branches[0]["run_id"]}"' in page.text
    )
    assert f'href="/dashboard/runs/{run_id}"' in child_page.text
    assert refused.status_code == 400, refused.text
    assert "for_each: must be a JSON list" in refused.text


def test_a_failed_run_is_rerun_through_its_route_and_a_live_one_is_refused(
    api: ApiServer, worker: ManagedProcess, token: str
) -> None:
    flow = scripted([["failed"]], error="flaky")
    with api.client(token) as client:
        run_id = client.post("/runs", json={"workflow": flow}).json()["id"]
        wait_for(
            lambda: client.get(f"/runs/{run_id}").json()["status"] == "failed",
            30,
            interval=0.1,
            what="the run failed",
        )
        rerun = client.post(f"/runs/{run_id}/rerun", json={"request_id": "r-1"})
        again = client.post(f"/runs/{run_id}/rerun", json={"request_id": "r-1"})
        source = client.get(f"/runs/{run_id}").json()
        live = client.post("/runs", json={"workflow": scripted([["running"]])}).json()["id"]
        refused = client.post(f"/runs/{live}/rerun", json={})
        client.post(f"/runs/{live}/cancel")
    assert rerun.status_code == 201, rerun.text
    assert rerun.json()["rerun_of"] == run_id and again.json()["id"] == rerun.json()["id"]
    assert source["reruns"] == [rerun.json()["id"]]
    assert refused.status_code == 409 and "can be rerun" in refused.text
