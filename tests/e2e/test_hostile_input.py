"""Hostile input over real HTTP and through the real CLI (hypothesis): always a clear error or
a valid run; never a 500, a traceback, a partial write or a stuck row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from orchestration.core.db import session_scope
from orchestration.core.models import Run, RunEvent, Step
from tests.e2e.conftest import ApiServer
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).parent / "orchestration")
HOSTILE_TEXT = st.sampled_from(
    [
        "{{ __import__('os').system('id') }}",
        "{{ args.__class__.__mro__ }}",
        "{{{{ x }}}}",
        "../../etc/passwd",
        "a/b",
        "\u202eevil\u200b",
        "\x00",
        "💥" * 50,
        "{{ steps.later.output }}",
        "x" * 300,
    ]
)
JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON = st.recursive(
    JSON_LEAF | HOSTILE_TEXT,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
STEP = st.fixed_dictionaries(
    {
        "id": st.one_of(st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True), HOSTILE_TEXT),
        "provider": st.sampled_from(["scripted", "nope", ""]),
    },
    optional={
        "task": JSON,
        "with": st.one_of(
            st.just({"states": [["completed"]]}), st.dictionaries(st.text(max_size=8), JSON)
        ),
        "timeout": st.one_of(
            st.floats(allow_nan=False, allow_infinity=False), st.integers(), st.text(max_size=5)
        ),
        "poll_interval": st.sampled_from([0.1, 0, -1, "x"]),
        "max_poll_interval": st.sampled_from([0.5, 1e9]),
    },
)
WORKFLOW = st.one_of(
    st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=20), JSON_LEAF), "steps": st.lists(STEP, max_size=3)}
    ),
    JSON,
)


def counts(stack: Stack, owner: str) -> tuple[int, int, int]:
    with session_scope(stack.settings.database_url) as session:
        runs = session.scalar(select(func.count()).select_from(Run).where(Run.owner == owner))
        steps = session.scalar(
            select(func.count()).select_from(Step).join(Run).where(Run.owner == owner)
        )
        events = session.scalar(
            select(func.count()).select_from(RunEvent).join(Run).where(Run.owner == owner)
        )
    return runs or 0, steps or 0, events or 0


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(workflow=WORKFLOW, args=JSON)
def test_http_launch_never_crashes_or_half_writes(
    api: ApiServer, stack: Stack, owner: str, token: str, workflow: Any, args: Any
) -> None:
    before = counts(stack, owner)
    with api.client(token) as client:
        reply = client.post("/runs", json={"workflow": workflow, "args": args})
    assert reply.status_code < 500, reply.text
    body = reply.json()
    if reply.status_code >= 400:
        assert set(body["error"]) >= {"code", "message"}, body
        assert counts(stack, owner) == before, "a refused launch wrote rows"
    else:
        assert body["status"] == "queued" and body["owner"] == owner


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(workflow=WORKFLOW, args=JSON)
def test_cli_launch_gives_a_clear_error_or_a_run(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory, workflow: Any, args: Any
) -> None:
    folder = tmp_path_factory.mktemp("wf")
    path = folder / "workflow.json"
    path.write_text(json.dumps(workflow))
    owner = "cli-" + folder.name[-8:]
    before = counts(stack, owner)
    done = subprocess.run(
        [CLI, "launch", str(path), "--args", json.dumps(args), "--json", "--owner", owner],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        assert json.loads(done.stdout)["status"] == "queued"
    else:
        assert done.returncode == 2, done.stderr
        assert json.loads(done.stderr)["error"]["message"]
        assert counts(stack, owner) == before


@pytest.mark.parametrize(
    "raw",
    [
        b'{"workflow": null, "args": Infinity}',
        b'{"args": NaN}',
        b'{"workflow": {"name": "x", "steps": [{"id": "a", '
        b'"provider": "scripted", "task": -Infinity}]}}',
    ],
)
def test_non_finite_numbers_in_a_raw_body_are_a_clear_error(
    api: ApiServer, stack: Stack, owner: str, token: str, raw: bytes
) -> None:
    before = counts(stack, owner)
    with api.client(token) as client:
        reply = client.post("/runs", content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["error"]["code"]
    assert counts(stack, owner) == before
