"""The dashboard's delete button (issue 32) over plain HTTP: an ended run's page offers it, the
form is CSRF-checked, a refused delete is shown as the error, and a delete lands on the run
list with a notice; the deletion is recorded as the dashboard's. The browser's click is in
``tests/e2e/test_dashboard.py``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from orchestration.core.db import session_scope
from orchestration.core.errors import RunNotFound
from orchestration.core.followups import Done
from orchestration.core.settings import Settings
from orchestration.runs import deletion
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.app import create_app
from orchestration.surfaces.api.auth import COOKIE, csrf_value
from tests.unit.support import T0, Clock, RecordingDispatcher, insert_run

OWNER = "acme"


@pytest.fixture
def orch(settings: Settings) -> Orchestrator:
    return Orchestrator(settings, RecordingDispatcher(), clock=Clock(T0))


def _signed_in(orch: Orchestrator, owner: str = OWNER) -> tuple[TestClient, str]:
    """A dashboard client signed in by cookie as ``owner``, and its forms' CSRF value."""
    with session_scope(orch.settings.database_url) as session:
        token = tokens.create(session, owner, "browser", now=T0)
    client = TestClient(create_app(orch), follow_redirects=False)
    client.cookies.set(COOKIE, token)
    return client, csrf_value(token)


def test_the_delete_button_deletes_an_ended_run_and_lands_on_the_list_with_a_notice(
    orch: Orchestrator,
) -> None:
    ended = insert_run(orch.settings, "failed", owner=OWNER, finished_at=T0)
    kept = insert_run(orch.settings, "completed", owner=OWNER, finished_at=T0)
    client, csrf = _signed_in(orch)
    page = client.get(f"/dashboard/runs/{ended}").text
    assert f'action="/dashboard/runs/{ended}/delete"' in page and 'id="delete"' in page

    done = client.post(f"/dashboard/runs/{ended}/delete", data={"csrf": csrf})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == f"/dashboard?deleted={ended}"
    listed = client.get(done.headers["location"]).text
    assert f'Deleted run <span class="mono">{ended}</span>' in listed
    assert f'data-run-id="{ended}"' not in listed and f'data-run-id="{kept}"' in listed
    with pytest.raises(RunNotFound):
        orch.get(ended, owner=OWNER)
    audit = orch.transact(lambda session: Done(deletion.listing(session, owner=OWNER, limit=5)))
    assert [(row["run_id"], row["by"]) for row in audit] == [(ended, "dashboard")]
    # Posted again (a reload, a second tab): the run is gone, said as such.
    again = client.post(f"/dashboard/runs/{ended}/delete", data={"csrf": csrf})
    assert again.status_code == 404 and ended in again.text


def test_a_forged_form_a_live_run_and_another_owners_run_are_refused(
    orch: Orchestrator,
) -> None:
    live = insert_run(orch.settings, "running", owner=OWNER)
    ended = insert_run(orch.settings, "completed", owner=OWNER, finished_at=T0)
    theirs = insert_run(orch.settings, "completed", owner="other", finished_at=T0)
    client, csrf = _signed_in(orch)

    for forged in ("guess", "", csrf[:-1]):
        refused = client.post(f"/dashboard/runs/{ended}/delete", data={"csrf": forged})
        assert refused.status_code == 403, forged
    assert orch.get(ended, owner=OWNER).status == "completed"

    assert 'id="delete"' not in client.get(f"/dashboard/runs/{live}").text
    busy = client.post(f"/dashboard/runs/{live}/delete", data={"csrf": csrf})
    assert busy.status_code == 409
    assert f"run {live} is running: only an ended run can be deleted" in busy.text
    assert orch.get(live, owner=OWNER).status == "running"

    hidden = client.post(f"/dashboard/runs/{theirs}/delete", data={"csrf": csrf})
    assert hidden.status_code == 404
    assert orch.get(theirs, owner="other").status == "completed"


def test_an_operator_is_not_offered_the_button_and_cannot_post_it(orch: Orchestrator) -> None:
    ended = insert_run(orch.settings, "completed", owner=OWNER, finished_at=T0)
    with session_scope(orch.settings.database_url) as session:
        token = tokens.create(session, None, "oncall", now=T0, operator=True)
    client = TestClient(create_app(orch), follow_redirects=False)
    client.cookies.set(COOKIE, token)
    assert 'id="delete"' not in client.get(f"/dashboard/runs/{ended}").text
    refused = client.post(f"/dashboard/runs/{ended}/delete", data={"csrf": csrf_value(token)})
    assert refused.status_code == 403 and "deleting are the owner&#39;s" in refused.text
    assert orch.get(ended, owner=OWNER).status == "completed"
