"""The dashboard in a real headless Chromium (Debian's ``chromium``), driven over the Chrome
DevTools Protocol: sign in through the form, read the runs list, click a run's cancel button,
and keep screenshots under ``test-artifacts/`` for a person to look at."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from orchestration.core.db import session_scope, utcnow
from orchestration.core.errors import RunNotFound, ValidationError
from orchestration.core.followups import Done
from orchestration.reads import fleet
from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator
from orchestration.surfaces.api import tokens
from orchestration.surfaces.api.headers import CONTENT_SECURITY_POLICY
from tests.conftest import IN_CI, wait_for
from tests.e2e.conftest import ApiServer, make_token, scripted
from tests.integration.conftest import Stack

pytestmark = pytest.mark.e2e
#: This deployment serves the dashboard over plain http on loopback: its cookies are not
#: ``Secure``, so the httpx clients below (which honour the flag) keep them.
STACK_SETTINGS = {"ORCH_DASHBOARD_PLAIN_HTTP": "true"}

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium")

try:
    from websockets.sync.client import ClientConnection, connect
except ImportError:  # pragma: no cover - depends on the environment
    connect = None  # type: ignore[assignment]


class Browser:
    """One page of a headless Chromium, spoken to over CDP (a websocket, JSON messages)."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=30))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return reply["result"].get("value")

    def mark(self) -> None:
        """Tag the current document, so :meth:`loaded` can tell when a new one replaced it."""
        self.evaluate("window.__old = true")

    def open(self, url: str) -> None:
        self.mark()
        self.call("Page.navigate", url=url)
        self.loaded()

    def loaded(self) -> None:
        """Wait until a new document (after :meth:`mark`) has finished loading."""
        wait_for(
            lambda: self.evaluate("!window.__old && document.readyState === 'complete'"),
            15,
            interval=0.05,
            what="the next page loaded",
        )

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the element (not a synthetic JS click)."""
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def type_into(self, selector: str, text: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def resize(self, width: int, height: int = 860) -> None:
        """Lay the page out at ``width`` CSS pixels (a phone's viewport below 600)."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=width < 600,
        )

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if CHROMIUM is None or connect is None:
        missing = "chromium (apt-get install chromium)" if CHROMIUM is None else "websockets"
        if IN_CI:
            pytest.fail(f"CI=true but {missing} is missing")
        pytest.skip(f"{missing} is not installed")
    profile = tmp_path_factory.mktemp("chromium")
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--hide-scrollbars",
        "--mute-audio",
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "--window-size=1366,860",
        "about:blank",
    ]
    log = open(profile / "chromium.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Port 0: Chromium picks a free port and writes it to DevToolsActivePort.
        active = profile / "DevToolsActivePort"
        wait_for(
            lambda: active.exists() and active.read_text().count("\n") >= 1,
            30,
            what="chromium DevTools port",
        )
        port = int(active.read_text().splitlines()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as socket:
            tab = Browser(socket)
            tab.call("Page.enable")
            yield tab
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


def _rows(tab: Browser) -> dict[str, dict[str, str]]:
    rows = tab.evaluate(
        "Array.from(document.querySelectorAll('tr[data-run-id]')).map(r => [r.dataset.runId,"
        " Array.from(r.cells).map(c => c.innerText.trim())])"
    )
    return {
        run_id: dict(
            zip(
                ("run", "workflow", "status", "health", "age", "deadline", "stop"),
                cells,
                strict=True,
            )
        )
        for run_id, cells in rows
    }


def test_dashboard_lists_runs_and_its_cancel_button_cancels(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    from tests.e2e.conftest import make_token

    token = make_token(stack, owner, "browser")
    cancelled = orch.launch(scripted([["running"]], name="cancelled <b>early</b>"), owner=owner)
    running = orch.launch(scripted([["running"]], name="summarise-tickets"), owner=owner)
    wait_for(lambda: orch.get(running.id, owner=owner).status == "running", 20, what="running")
    orch.cancel(cancelled.id, owner=owner)
    other = orch.launch(scripted([["completed"]], name="not yours"), owner=owner + "-other")

    browser.open(f"{api.url}/dashboard")
    assert browser.evaluate("location.pathname") == "/dashboard/login"
    browser.type_into("input[name=token]", token)
    browser.mark()
    browser.click("button[type=submit].btn-primary")
    browser.loaded()
    assert browser.evaluate("location.pathname") == "/dashboard"

    rows = _rows(browser)
    assert set(rows) == {running.id, cancelled.id}, rows
    assert other.id not in rows
    assert (rows[running.id]["status"], rows[running.id]["health"]) == ("running", "working")
    assert rows[running.id]["deadline"] != "-"
    assert (rows[cancelled.id]["status"], rows[cancelled.id]["health"]) == ("cancelled", "ended")
    assert rows[cancelled.id]["stop"] == "cancel_requested"
    # User-controlled text is escaped, not markup.
    assert rows[cancelled.id]["workflow"] == "cancelled <b>early</b>"
    assert browser.evaluate("document.querySelectorAll('tr[data-run-id] b').length") == 0
    browser.screenshot("dashboard-runs.png")

    browser.open(f"{api.url}/dashboard?status=running")
    assert set(_rows(browser)) == {running.id}
    browser.open(f"{api.url}/dashboard?health=ended")
    assert set(_rows(browser)) == {cancelled.id}

    page = f"{api.url}/dashboard/runs/{running.id}"
    browser.open(page)
    assert browser.evaluate("document.getElementById('run-status').innerText") == "running"
    assert running.id in browser.evaluate("document.getElementById('explain').innerText")
    browser.screenshot("dashboard-run-running.png")
    browser.mark()
    browser.click("#cancel")
    browser.loaded()
    assert browser.evaluate("location.pathname") == f"/dashboard/runs/{running.id}"
    assert browser.evaluate("document.getElementById('run-status').innerText") == "cancelled"
    record = orch.get(running.id, owner=owner)
    assert (record.status, record.stop_reason) == ("cancelled", "cancel_requested")
    assert "cancelled by the caller" in browser.evaluate("document.body.innerText")
    assert browser.evaluate("document.getElementById('cancel')") is None
    browser.screenshot("dashboard-run-cancelled.png")

    browser.open(f"{api.url}/dashboard/runs/{other.id}")
    assert "Not found" in browser.evaluate("document.body.innerText")


def test_cancel_form_without_the_csrf_value_is_refused(
    api: ApiServer, worker: ManagedProcess, stack: Stack, orch: Orchestrator, owner: str
) -> None:
    from tests.e2e.conftest import make_token

    token = make_token(stack, owner)
    run = orch.launch(scripted([["running"]]), owner=owner)
    with httpx.Client(base_url=api.url, cookies={"orch_token": token}) as client:
        for value in ("guess", "é" * 64, "\u2603", ""):
            forged = client.post(f"/dashboard/runs/{run.id}/cancel", data={"csrf": value})
            assert forged.status_code == 403, (value, forged.status_code)
        assert orch.get(run.id, owner=owner).status != "cancelled"
    orch.cancel(run.id, owner=owner)


def test_login_form_needs_its_csrf_value(api: ApiServer, stack: Stack, owner: str) -> None:
    from tests.e2e.conftest import make_token

    token = make_token(stack, owner)
    with httpx.Client(base_url=api.url) as client:
        # A cross-site post carries neither the form's value nor its SameSite=Strict cookie.
        bare = client.post("/dashboard/login", data={"token": token})
        assert bare.status_code == 403 and "orch_token" not in bare.cookies
        form = client.get("/dashboard/login")
        value = form.cookies["orch_login_csrf"]
        assert f'name="csrf" value="{value}"' in form.text
        for forged in ("guess", "é" * 43, ""):
            refused = client.post("/dashboard/login", data={"token": token, "csrf": forged})
            assert refused.status_code == 403, (forged, refused.status_code)
            assert "orch_token" not in refused.cookies
        wrong = client.post("/dashboard/login", data={"token": "orch_nope", "csrf": value})
        assert wrong.status_code == 401 and "unknown or revoked token" in wrong.text
        signed_in = client.post("/dashboard/login", data={"token": token, "csrf": value})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/dashboard"
        assert signed_in.cookies["orch_token"] == token
    # The form's value alone, from another client, is not enough either.
    with httpx.Client(base_url=api.url) as other:
        replayed = other.post("/dashboard/login", data={"token": token, "csrf": value})
        assert replayed.status_code == 403


def _sign_in(browser: Browser, api: ApiServer, token: str) -> None:
    browser.open(f"{api.url}/dashboard/login")
    browser.type_into("input[name=token]", token)
    browser.mark()
    browser.click("button[type=submit].btn-primary")
    browser.loaded()
    assert browser.evaluate("location.pathname") == "/dashboard"


def _two_steps(second: list[list[Any]]) -> dict[str, Any]:
    flow = scripted([["completed"]], name="two-steps")
    flow["steps"].append({**flow["steps"][0], "id": "s2", "with": {"states": second}})
    return flow


def test_the_rerun_button_reruns_an_ended_run_from_its_failed_step(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    from tests.e2e.conftest import make_token

    token = make_token(stack, owner, "browser")
    failed = orch.launch(_two_steps([["failed"]]), owner=owner)
    live = orch.launch(scripted([["running"]]), owner=owner)
    wait_for(lambda: orch.get(failed.id, owner=owner).status == "failed", 20, what="failed")
    wait_for(lambda: orch.get(live.id, owner=owner).status == "running", 20, what="running")
    _sign_in(browser, api, token)

    browser.open(f"{api.url}/dashboard/runs/{live.id}")
    assert browser.evaluate("document.getElementById('rerun')") is None  # not for a live run
    browser.open(f"{api.url}/dashboard/runs/{failed.id}")
    options = browser.evaluate(
        "Array.from(document.querySelectorAll('#from-step option')).map(o => o.value)"
    )
    assert options == ["", "s1", "s2"]
    browser.screenshot("dashboard-run-failed.png")
    browser.mark()
    browser.click("#rerun")
    browser.loaded()
    path = browser.evaluate("location.pathname")
    rerun_id = path.rsplit("/", 1)[-1]
    assert path == f"/dashboard/runs/{rerun_id}" and rerun_id != failed.id
    rerun = orch.get(rerun_id, owner=owner)
    assert (rerun.rerun_of, rerun.steps[0].status) == (failed.id, "completed")
    assert browser.evaluate("document.getElementById('rerun-of').innerText") == failed.id
    wait_for(lambda: orch.get(rerun_id, owner=owner).status == "failed", 20, what="rerun ended")
    browser.open(f"{api.url}/dashboard/runs/{failed.id}")
    assert browser.evaluate("document.getElementById('reruns').innerText") == rerun_id
    browser.screenshot("dashboard-run-reruns.png")

    # The form's request id makes a double submit one rerun; a live run is refused clearly;
    # another owner's run is not found.
    with httpx.Client(base_url=api.url, cookies={"orch_token": token}) as client:
        page = client.get(f"/dashboard/runs/{failed.id}").text
        form = {
            name: page.split(f'name="{name}" value="', 1)[1].split('"', 1)[0]
            for name in ("csrf", "request_id")
        }
        posted = [
            client.post(f"/dashboard/runs/{failed.id}/rerun", data={**form, "from_step": "s2"})
            for _ in range(2)
        ]
        assert [p.status_code for p in posted] == [303, 303]
        assert posted[0].headers["location"] == posted[1].headers["location"]
        assert len(orch.get(failed.id, owner=owner).reruns) == 2
        refused = client.post(f"/dashboard/runs/{live.id}/rerun", data=form)
        assert refused.status_code == 409 and "is running" in refused.text, refused.text
        assert "only a run that ended failed" in refused.text
        theirs = orch.launch(scripted([["failed"]]), owner=owner + "-other")
        hidden = client.post(f"/dashboard/runs/{theirs.id}/rerun", data=form)
        assert hidden.status_code == 404
    orch.cancel(live.id, owner=owner)


def test_an_operator_sees_every_owners_runs_and_cancels_one_journalled_by_name(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    beat: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    with session_scope(stack.settings.database_url) as session:
        token = tokens.create(session, None, "oncall-alice", now=utcnow(), operator=True)
    mine = orch.launch(scripted([["running"]], name="acme-job"), owner=owner)
    theirs = orch.launch(scripted([["running"]], name="globex-job"), owner=owner + "-globex")
    wait_for(lambda: orch.get(theirs.id, owner=owner + "-globex").status == "running", 20)
    _sign_in(browser, api, token)
    assert "operator oncall-alice" in browser.evaluate("document.querySelector('.who').innerText")
    owners = browser.evaluate(
        "Object.fromEntries(Array.from(document.querySelectorAll('tr[data-run-id]')).map("
        "r => [r.dataset.runId, r.querySelector('td.owner').innerText]))"
    )
    assert (owners[mine.id], owners[theirs.id]) == (owner, owner + "-globex")
    browser.screenshot("dashboard-operator-runs.png")
    browser.open(f"{api.url}/dashboard?owner={owner}-globex")
    shown = browser.evaluate(
        "Array.from(document.querySelectorAll('tr[data-run-id]')).map(r => r.dataset.runId)"
    )
    assert shown == [theirs.id]
    browser.open(f"{api.url}/dashboard/runs/{theirs.id}")
    assert browser.evaluate("document.getElementById('owner').innerText") == owner + "-globex"
    browser.mark()
    browser.click("#cancel")
    browser.loaded()
    assert browser.evaluate("document.getElementById('run-status').innerText") == "cancelled"
    causes = [event["cause"] for event in orch.events(theirs.id, owner=owner + "-globex")]
    assert "cancel requested by operator oncall-alice" in causes
    assert "cancelled by operator oncall-alice" in browser.evaluate("document.body.innerText")
    browser.screenshot("dashboard-operator-cancelled.png")
    # The fleet page: the worker that ran the steps, the sweeper's pass, the queue, the plots.
    wait_for(
        lambda: orch.transact(
            lambda session: Done(fleet.snapshot(session, stack.settings, orch.clock()).sweepers)
        ),
        30,
        what="a sweeper pass",
    )
    browser.open(f"{api.url}/dashboard/fleet")
    workers = browser.evaluate(
        "Array.from(document.querySelectorAll('tr[data-worker]')).map(r => r.dataset.worker)"
    )
    assert workers, "no host that ran a step is shown"
    nodes = browser.evaluate("document.querySelector('#workers td.nodes').innerText")
    assert f"-{stack.settings.queue}@" in nodes and "prefork" in nodes, nodes
    assert browser.evaluate("document.getElementById('queue-depth').innerText").isdigit()
    swept = browser.evaluate("document.getElementById('sweeper').innerText")
    assert "live " in swept and " ms" in swept, swept  # the runs it looked at, and its time
    for plot in ("started", "ended"):
        assert browser.evaluate(f"document.querySelectorAll('#plot-{plot} rect.bar').length") == 60
    for plot in ("poll-lateness", "sweep-time"):  # bars only for minutes that are over
        assert browser.evaluate(f"document.getElementById('plot-{plot}').tagName") == "svg"
    browser.screenshot("dashboard-fleet.png")
    # An owner's token still sees only its own runs, and not the other owner's run page.
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    browser.open(f"{api.url}/dashboard/runs/{theirs.id}")
    assert "Not found" in browser.evaluate("document.body.innerText")
    browser.open(f"{api.url}/dashboard?owner={owner}-globex")
    listed = browser.evaluate(
        "Array.from(document.querySelectorAll('tr[data-run-id]')).map(r => r.dataset.runId)"
    )
    assert theirs.id not in listed and mine.id in listed
    orch.cancel(mine.id, owner=owner)


def test_an_owner_launches_each_registered_version_from_the_form_and_sees_it_ran(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    def research(task: str) -> dict[str, Any]:
        flow = scripted([["completed"]], name="research")
        flow["steps"][0]["task"] = task
        flow["args_schema"] = {
            "type": "object",
            "required": ["topic"],
            "properties": {"topic": {"type": "string", "minLength": 2}},
        }
        return flow

    orch.register_workflow(research("Research {{ args.topic }}"), owner=owner)
    orch.register_workflow(research("Dig into {{ args.topic }}"), owner=owner)
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    for version, task in ((1, "Research otters"), (2, "Dig into otters")):
        browser.open(f"{api.url}/dashboard/launch?workflow=research@{version}")
        assert browser.evaluate("document.getElementById('chosen').innerText") == (
            f"research@{version}"
        )
        browser.type_into("#arg-topic", "x" if version == 1 else "otters")
        if version == 1:
            # Too short: the browser's own check (minlength) holds the form back; with it
            # off, the server's check puts the error at the field, and nothing is launched.
            assert browser.evaluate("document.getElementById('arg-topic').validity.tooShort")
            browser.evaluate("document.getElementById('launch-form').noValidate = true")
        browser.mark()
        browser.click("#launch")
        browser.loaded()
        if version == 1:
            error = browser.evaluate("document.getElementById('error-topic').innerText")
            assert "at least 2" in error, error
            browser.screenshot("dashboard-launch-error.png")
            browser.evaluate("document.getElementById('arg-topic').value = ''")
            browser.type_into("#arg-topic", "otters")
            browser.mark()
            browser.click("#launch")
            browser.loaded()
        run_id = browser.evaluate("location.pathname").rsplit("/", 1)[1]
        wait_for(lambda ran=run_id: orch.get(ran, owner=owner).status == "completed", 30)
        browser.open(f"{api.url}/dashboard/runs/{run_id}")
        text = browser.evaluate("document.body.innerText")
        assert f"research@{version}" in text
        assert orch.get(run_id, owner=owner).steps[0].input == task
        bars = browser.evaluate("document.querySelectorAll('#phases rect.phase').length")
        assert bars >= 1
    browser.screenshot("dashboard-run-timeline.png")


def test_a_live_run_page_updates_in_place_without_a_reload(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    run = orch.launch(scripted([["running", 4.0], ["completed"]], name="live"), owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).status == "running", 20)
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    browser.open(f"{api.url}/dashboard/runs/{run.id}")
    assert browser.evaluate("document.getElementById('run-status').innerText") == "running"
    browser.evaluate("window.keptAcrossUpdates = 42")  # a reload would drop it
    wait_for(
        lambda: browser.evaluate("document.getElementById('run-status').innerText") == "completed",
        30,
        what="the page showing the run completed",
    )
    assert browser.evaluate("window.keptAcrossUpdates") == 42
    assert browser.evaluate("location.pathname") == f"/dashboard/runs/{run.id}"


#: axe-core's browser build; `.ci/run` installs it from the npm registry.
AXE = os.environ.get("ORCH_TEST_AXE")


def _audit(browser: Browser, name: str) -> list[dict[str, Any]]:
    """Run axe-core on the page; keep its full result in ``test-artifacts/axe-NAME.json``
    and a screenshot in ``page-NAME.png``, and return the serious and critical violations."""
    assert AXE is not None
    browser.screenshot(f"page-{name}.png")
    browser.call("Runtime.evaluate", expression=Path(AXE).read_text())
    reply = browser.call(
        "Runtime.evaluate",
        expression="axe.run(document).then(r => JSON.stringify(r))",
        awaitPromise=True,
        returnByValue=True,
    )
    result = json.loads(reply["result"]["value"])
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"axe-{name}.json").write_text(json.dumps(result["violations"], indent=2))
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:3]}
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.skipif(not AXE and not IN_CI, reason="set ORCH_TEST_AXE to axe.min.js (.ci/run does)")
def test_every_page_has_no_serious_or_critical_axe_core_violation(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    flow = scripted([["running", 30.0]], name="audited")
    flow["args_schema"] = {"type": "object", "properties": {"topic": {"type": "string"}}}
    flow["schedule"] = {"cron": "0 0 1 1 *", "args": {"topic": "the year"}}  # shown, not fired
    orch.register_workflow(flow, owner=owner)
    run = orch.launch("audited", {"topic": "otters"}, owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).status == "running", 20)
    found: dict[str, list[dict[str, Any]]] = {}
    browser.open(f"{api.url}/dashboard/login")
    found["login"] = _audit(browser, "login")
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    for name, path in (
        ("runs", "/dashboard"),
        ("run", f"/dashboard/runs/{run.id}"),
        ("launch", "/dashboard/launch"),
        ("schedules", "/dashboard/schedules"),
        ("not-found", "/dashboard/runs/nope"),
    ):
        browser.open(f"{api.url}{path}")
        found[name] = _audit(browser, name)
        if name == "schedules":
            assert "audited@1" in browser.evaluate("document.body.innerText")
    with session_scope(stack.settings.database_url) as session:
        operator = tokens.create(session, None, "axe", now=utcnow(), operator=True)
    _sign_in(browser, api, operator)
    browser.open(f"{api.url}/dashboard/fleet")
    found["fleet"] = _audit(browser, "fleet")
    orch.cancel(run.id, owner=owner)
    assert {name: bad for name, bad in found.items() if bad} == {}


#: The widths every page is looked at: a laptop's and a phone's (CSS pixels).
WIDTHS = {"laptop": 1366, "narrow": 390}


def _look_at(browser: Browser, name: str) -> dict[str, int]:
    """Keep a screenshot of the page at each of :data:`WIDTHS` (``page-NAME-WIDTH.png``), and
    say by how many pixels the page itself scrolls sideways at each (0: it does not; a wide
    table scrolls in its own box)."""
    overflow = {}
    for label, width in WIDTHS.items():
        browser.resize(width)
        overflow[label] = max(
            browser.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            ),
            0,
        )
        browser.screenshot(f"page-{name}-{label}.png")
    browser.resize(WIDTHS["laptop"])
    return overflow


#: What :func:`_look_at` says of a page that never scrolls sideways.
FITS = dict.fromkeys(WIDTHS, 0)


#: Installed in every document before its own code runs: the policy's violations, kept.
_RECORD_VIOLATIONS = (
    "window.__violations = [];"
    "document.addEventListener('securitypolicyviolation',"
    " e => window.__violations.push(e.effectiveDirective + ' ' + e.blockedURI));"
)


def test_every_page_has_its_title_and_works_under_its_content_security_policy(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    flow = scripted([["running", 30.0]], name="pages")
    flow["args_schema"] = {"type": "object", "properties": {"topic": {"type": "string"}}}
    flow["schedule"] = {"cron": "0 0 1 1 *", "args": {"topic": "the year"}}  # shown, not fired
    orch.register_workflow(flow, owner=owner)
    run = orch.launch("pages", {"topic": "otters"}, owner=owner)
    wait_for(lambda: orch.get(run.id, owner=owner).status == "running", 20)
    with session_scope(stack.settings.database_url) as session:
        operator = tokens.create(session, None, "pages", now=utcnow(), operator=True)
    mine = make_token(stack, owner, "browser")
    expected = {
        "login": "Sign in",
        "runs": "Runs",
        "run": f"Run {run.id}",
        "launch": "Launch a run",
        "schedules": "Schedules",
        "not-found": "Not found",
        "fleet": "Fleet",
    }
    paths = {
        "login": "/dashboard/login",
        "runs": "/dashboard",
        "run": f"/dashboard/runs/{run.id}",
        "launch": "/dashboard/launch",
        "schedules": "/dashboard/schedules",
        "not-found": "/dashboard/runs/nope",
        "fleet": "/dashboard/fleet",
    }
    seen: dict[str, dict[str, Any]] = {}
    watcher = browser.call("Page.addScriptToEvaluateOnNewDocument", source=_RECORD_VIOLATIONS)
    try:
        for name, path in paths.items():
            token = operator if name == "fleet" else mine
            if name in ("runs", "fleet"):
                _sign_in(browser, api, token)
            with httpx.Client(base_url=api.url, cookies={"orch_token": token}) as client:
                headers = client.get(path).headers
            browser.open(f"{api.url}{path}")
            seen[name] = {
                "title": browser.evaluate("document.title"),
                "policy": headers.get("content-security-policy"),
                "framing": headers.get("x-frame-options"),
                "sniffing": headers.get("x-content-type-options"),
                # The stylesheet applied: it is the only place the header's colour is set.
                "header": browser.evaluate(
                    "getComputedStyle(document.querySelector('header')).backgroundColor"
                ),
                "violations": browser.evaluate("window.__violations"),
                "overflow": _look_at(browser, name),
            }
        assert seen == {
            name: {
                "title": f"{title} · orchestration",
                "policy": CONTENT_SECURITY_POLICY,
                "framing": "DENY",
                "sniffing": "nosniff",
                "header": "rgb(36, 41, 47)",
                "violations": [],
                "overflow": FITS,
            }
            for name, title in expected.items()
        }
        _sign_in(browser, api, mine)
        # The live run page's script ran under the policy: it fetched the page again.
        browser.open(f"{api.url}/dashboard/runs/{run.id}")
        wait_for(
            lambda: browser.evaluate(
                "performance.getEntriesByType('resource')"
                f".some(e => e.name.endsWith('/dashboard/runs/{run.id}'))"
            ),
            10,
            what="the live update's fetch",
        )
        assert browser.evaluate("window.__violations") == []
        # Sign out is a form with the session's CSRF value: it works from the page.
        browser.mark()
        browser.click("#sign-out")
        browser.loaded()
        assert browser.evaluate("location.pathname") == "/dashboard/login"
        browser.open(f"{api.url}/dashboard")
        assert browser.evaluate("location.pathname") == "/dashboard/login"
    finally:
        browser.call("Page.removeScriptToEvaluateOnNewDocument", identifier=watcher["identifier"])
        orch.cancel(run.id, owner=owner)


#: The run page's steps table, row by row: each cell under the header of the column it
#: starts in (colspans counted), and how many columns the row spans.
_STEP_ROWS = """(() => {
  const table = Array.from(document.querySelectorAll('table'))
    .find(t => t.tHead && t.tHead.textContent.includes('Provider says'));
  const heads = Array.from(table.tHead.rows[0].cells).map(c => c.textContent.trim());
  return {heads: heads, rows: Array.from(table.tBodies[0].rows).map(r => {
    const row = {kind: r.className, span: 0, cells: {}};
    for (const c of r.cells) {
      row.cells[heads[row.span]] = c.innerText.trim();
      row.span += c.colSpan;
    }
    return row;
  })};
})()"""


def test_past_attempts_line_up_with_the_steps_columns(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    flow = scripted(
        [["completed"]],
        name="flaky",
        attempt_states=[[["running", 0.2], ["failed"]]],
        error="the model was overloaded",
    )
    # The second attempt waits 30 s: the page shows the ended attempt and the next one.
    flow["steps"][0]["retry"] = {"attempts": 2, "backoff": 30, "on": ["failed"]}
    run = orch.launch(flow, owner=owner)
    wait_for(
        lambda: orch.get(run.id, owner=owner).steps[0].status == "retrying", 20, what="retrying"
    )
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    browser.open(f"{api.url}/dashboard/runs/{run.id}")
    table = browser.evaluate(_STEP_ROWS)
    width = len(table["heads"])
    assert width == 8, table["heads"]
    assert [row["span"] for row in table["rows"]] == [width] * 3, table["rows"]
    current, ended, upcoming = table["rows"]
    assert (current["cells"]["Step"], current["cells"]["Status"]) == ("s1", "retrying")
    assert current["cells"]["Attempt"] == "2"
    assert ended["kind"] == "past-attempt"
    assert (ended["cells"]["#"], ended["cells"]["Step"]) == ("", "s1")
    assert ended["cells"]["Status"].startswith("failed"), ended
    assert ended["cells"]["Attempt"] == "1"
    assert "the model was overloaded" in ended["cells"]["Output / error"]
    assert (upcoming["cells"]["Step"], upcoming["cells"]["Attempt"]) == ("s1", "2")
    assert upcoming["cells"]["Output / error"].startswith("starts at "), upcoming
    assert _look_at(browser, "run-retrying") == FITS
    orch.cancel(run.id, owner=owner)


def test_the_run_list_shows_top_level_runs_and_the_parent_page_lists_its_branches(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    branch = scripted([["completed"]])["steps"][0]
    branch.pop("id")
    branch["task"] = "about {{ item }}"
    flow = {"name": "fan", "steps": [{"id": "fan", "for_each": "{{ args.items }}", "step": branch}]}
    items = ["a", "b", "c", "d", "e"]
    fan = orch.launch(flow, {"items": items}, owner=owner)
    single = orch.launch(scripted([["completed"]], name="single"), owner=owner)
    wait_for(lambda: orch.get(fan.id, owner=owner).status == "completed", 30, what="fan-out")
    children = [b["run_id"] for b in orch.get(fan.id, owner=owner).steps[0].branches or []]
    assert len(children) == len(items)
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    listed = browser.evaluate(
        "Array.from(document.querySelectorAll('tr[data-run-id]')).map(r => r.dataset.runId)"
    )
    assert listed == [single.id, fan.id]  # newest first; no branch run
    count = f"tr[data-run-id='{fan.id}'] .branches"
    assert browser.evaluate(f"document.querySelector({json.dumps(count)}).innerText") == (
        "5 branch runs"
    )
    assert _look_at(browser, "runs-branches") == FITS
    browser.mark()
    browser.click(count)
    browser.loaded()
    assert browser.evaluate("location.pathname") == f"/dashboard/runs/{fan.id}"
    linked = browser.evaluate(
        "Array.from(document.querySelectorAll('#steps tr.branch a')).map(a => a.pathname)"
    )
    assert linked == [f"/dashboard/runs/{child}" for child in children]
    assert _look_at(browser, "run-branches") == FITS


def _schema_flow() -> dict[str, Any]:
    flow = scripted([["completed"]], name="kinds")
    flow["steps"][0]["task"] = "About {{ args.topic }}, {{ args.depth }} deep"
    flow["args_schema"] = {
        "type": "object",
        "required": ["topic", "flag"],
        "additionalProperties": False,
        "properties": {
            "topic": {"type": "string", "minLength": 2, "maxLength": 40, "description": "what"},
            "depth": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2},
            "tone": {"enum": ["dry", "warm"]},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    return flow


#: For each field of the launch form: its control's tag, type and HTML checks, and whether
#: its error (when shown) sits in the field's own box, under the control.
_FIELDS = """Array.from(document.querySelectorAll('.field[data-field]')).map(box => {
  const control = box.querySelector('input, select, textarea');
  const error = box.querySelector('.field-error');
  const below = error && error.getBoundingClientRect().top
    >= control.getBoundingClientRect().bottom;
  return [box.dataset.field, {
    tag: control.tagName.toLowerCase(), type: control.type, required: control.required,
    min: control.min || null, max: control.max || null,
    minlength: control.minLength, options: control.options
      ? Array.from(control.options).map(o => o.value) : null,
    error: error ? error.innerText : null, below: below,
    invalid: control.getAttribute('aria-invalid'),
  }];
})"""


def test_the_launch_form_is_built_from_the_args_schema_with_errors_at_their_fields(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    orch.register_workflow(_schema_flow(), owner=owner)
    _sign_in(browser, api, make_token(stack, owner, "browser"))
    browser.open(f"{api.url}/dashboard/launch?workflow=kinds")
    fields = dict(browser.evaluate(_FIELDS))
    assert list(fields) == ["topic", "flag", "depth", "tags", "tone"]  # required first
    assert {name: (f["tag"], f["type"]) for name, f in fields.items()} == {
        "topic": ("input", "text"),
        "depth": ("input", "number"),
        "tone": ("select", "select-one"),
        "flag": ("select", "select-one"),
        "tags": ("textarea", "textarea"),
    }
    assert [name for name, f in fields.items() if f["required"]] == ["topic", "flag"]
    assert (fields["depth"]["min"], fields["depth"]["max"]) == ("1", "5")
    assert fields["topic"]["minlength"] == 2
    assert fields["tone"]["options"] == ["", "dry", "warm"]
    assert fields["flag"]["options"] == ["", "true", "false"]
    assert browser.evaluate("document.getElementById('arg-depth').value") == "2"  # the default
    # The browser's own checks (a bonus): out of range and missing are held back.
    browser.evaluate("document.getElementById('arg-depth').value = '9'")
    browser.type_into("#arg-topic", "x")
    assert browser.evaluate("document.getElementById('arg-depth').validity.rangeOverflow")
    assert not browser.evaluate("document.getElementById('launch-form').checkValidity()")
    # The guarantee is the server's: every wrong field gets its error next to it.
    browser.evaluate("document.getElementById('arg-tags').value = '[1]'")
    browser.evaluate("document.getElementById('launch-form').noValidate = true")
    browser.mark()
    browser.click("#launch")
    browser.loaded()
    shown = dict(browser.evaluate(_FIELDS))
    errors = {name: f["error"] for name, f in shown.items() if f["error"]}
    assert errors == {
        "topic": "args.topic: must have at least 2 characters",
        "depth": "args.depth: must be at most 5",
        "flag": "args.flag: is required",
        "tags": "args.tags[0]: must be string, not integer",
    }
    assert all(shown[name]["below"] and shown[name]["invalid"] == "true" for name in errors)
    assert browser.evaluate("document.getElementById('arg-depth').value") == "9"  # kept
    assert _look_at(browser, "launch-errors") == FITS
    assert orch.list(owner=owner) == []
    browser.evaluate(
        "document.getElementById('arg-topic').value = 'otters';"
        "document.getElementById('arg-depth').value = '3';"
        "document.getElementById('arg-tone').value = 'warm';"
        "document.getElementById('arg-flag').value = 'true';"
        "document.getElementById('arg-tags').value = '[\"a\", \"b\"]';"
    )
    browser.mark()
    browser.click("#launch")
    browser.loaded()
    run_id = browser.evaluate("location.pathname").rsplit("/", 1)[1]
    run = orch.get(run_id, owner=owner)
    assert run.args == {
        "topic": "otters",
        "depth": 3,
        "tone": "warm",
        "flag": True,
        "tags": ["a", "b"],
    }
    wait_for(lambda: orch.get(run_id, owner=owner).status == "completed", 30)
    assert orch.get(run_id, owner=owner).steps[0].input == "About otters, 3 deep"


#: Owner-written text that would run, or break out of an attribute, if a page wrote it raw.
HOSTILE = (
    '"\'><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    "<svg onload=window.__pwned=3>"
)
#: Whether the page holds anything the text above would have made: a run flag, an element
#: it would have added, or a script that is not the dashboard's own.
_INJECTED = """({
  pwned: window.__pwned === undefined ? null : window.__pwned,
  elements: document.querySelectorAll('img, [onerror], [onload], svg:not(#phases)').length,
  scripts: Array.from(document.scripts).map(s => s.getAttribute('src'))
    .filter(src => src !== '/dashboard/static/live.js'),
})"""


def test_owner_written_text_is_inert_on_every_page(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    # A workflow name, an output and an error, all written by the owner.
    flow = scripted([["completed"]], name=f"name {HOSTILE}", output={"said": HOSTILE})
    flow["steps"].append(
        {**flow["steps"][0], "id": "s2", "with": {"states": [["failed"]], "error": HOSTILE}}
    )
    failed = orch.launch(flow, owner=owner)
    asking = orch.launch(
        {
            "name": "ask",
            "steps": [{"id": "ask", "approval": {"prompt": f"Ship {HOSTILE}?", "expires_in": 600}}],
        },
        owner=owner,
    )
    # A step id cannot hold it: refused at launch, never stored.
    with pytest.raises(ValidationError) as refused:
        orch.launch(scripted([["completed"]], step_id=HOSTILE), owner=owner)
    assert refused.value.field == "steps[0].id"
    # An args_schema: a property's name, description, enum values and default.
    schema_flow = scripted([["completed"]], name="schema")
    schema_flow["args_schema"] = {
        "type": "object",
        "properties": {
            HOSTILE: {"type": "string", "description": HOSTILE, "default": HOSTILE},
            "pick": {"enum": [HOSTILE, "plain"]},
        },
    }
    orch.register_workflow(schema_flow, owner=owner)
    wait_for(lambda: orch.get(failed.id, owner=owner).status == "failed", 30, what="failed")
    wait_for(lambda: orch.get(asking.id, owner=owner).status == "parked", 30, what="parked")
    token = make_token(stack, owner, "browser")
    _sign_in(browser, api, token)
    for name, path in (
        ("runs", "/dashboard"),
        ("failed", f"/dashboard/runs/{failed.id}"),
        ("approval", f"/dashboard/runs/{asking.id}"),
        ("launch", "/dashboard/launch?workflow=schema"),
    ):
        browser.open(f"{api.url}{path}")
        assert browser.evaluate(_INJECTED) == {"pwned": None, "elements": 0, "scripts": []}, name
        assert HOSTILE in browser.evaluate("document.body.innerText"), name  # shown, as text
        assert _look_at(browser, f"hostile-{name}") == FITS, name
    launch = browser.evaluate(
        "Array.from(document.querySelectorAll('#launch-form [name^=\"arg.\"]')).map(e => "
        "[e.name, e.value, e.options ? Array.from(e.options).map(o => o.value) : null])"
    )
    assert launch == [[f"arg.{HOSTILE}", HOSTILE, None], ["arg.pick", "", ["", HOSTILE, "plain"]]]
    # A step id in a URL comes back in an error page's message: as text too. (A path
    # segment holds no "/", so this one closes no tag.)
    step_id = '"\'><img src=x onerror="window.__pwned=2">'
    with httpx.Client(base_url=api.url, cookies={"orch_token": token}) as client:
        page = client.get(f"/dashboard/runs/{asking.id}").text
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        for url, form in (
            (f"/dashboard/runs/{asking.id}/steps/{quote(step_id, safe='')}/approval", {}),
            (f"/dashboard/runs/{failed.id}/rerun", {"from_step": step_id}),
        ):
            reply = client.post(url, data={"csrf": csrf, **form})
            assert reply.status_code in (404, 409), (url, reply.status_code, reply.text)
            assert "&lt;img src=x onerror=" in reply.text, reply.text
            assert "<img" not in reply.text
    orch.cancel(asking.id, owner=owner)


def test_the_delete_button_deletes_an_ended_run_and_says_so_on_the_run_list(
    api: ApiServer,
    browser: Browser,
    worker: ManagedProcess,
    stack: Stack,
    orch: Orchestrator,
    owner: str,
) -> None:
    token = make_token(stack, owner, "browser")
    done = orch.launch(_two_steps([["completed"]]), owner=owner)
    kept = orch.launch(scripted([["failed"]], name="kept"), owner=owner)
    live = orch.launch(scripted([["running"]]), owner=owner)
    for run_id, status in ((done.id, "completed"), (kept.id, "failed"), (live.id, "running")):
        wait_for(lambda: orch.get(run_id, owner=owner).status == status, 20, what=status)  # noqa: B023
    _sign_in(browser, api, token)

    browser.open(f"{api.url}/dashboard/runs/{live.id}")
    assert browser.evaluate("document.getElementById('delete')") is None  # not for a live run
    browser.open(f"{api.url}/dashboard/runs/{done.id}")
    browser.mark()
    browser.click("#delete")
    browser.loaded()
    assert (
        browser.evaluate("location.pathname + location.search") == f"/dashboard?deleted={done.id}"
    )
    notice = browser.evaluate("document.getElementById('deleted-notice').innerText")
    assert notice.startswith(f"Deleted run {done.id} with its branch runs")
    assert set(_rows(browser)) == {kept.id, live.id}
    browser.screenshot("dashboard-run-deleted.png")
    with pytest.raises(RunNotFound):
        orch.get(done.id, owner=owner)

    # A page left open on a run deleted meanwhile: the click says the run is gone.
    browser.open(f"{api.url}/dashboard/runs/{kept.id}")
    orch.delete(kept.id, owner=owner)
    browser.mark()
    browser.click("#delete")
    browser.loaded()
    assert "Not found" in browser.evaluate("document.body.innerText")

    # Plain HTTP: a live run is refused with what to do; a forged form changes nothing.
    with httpx.Client(base_url=api.url, cookies={"orch_token": token}) as client:
        page = client.get(f"/dashboard/runs/{live.id}").text
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        refused = client.post(f"/dashboard/runs/{live.id}/delete", data={"csrf": csrf})
        assert refused.status_code == 409 and "only an ended run can be deleted" in refused.text
        forged = client.post(f"/dashboard/runs/{live.id}/delete", data={"csrf": "guess"})
        assert forged.status_code == 403
    orch.cancel(live.id, owner=owner)
    deleted = orch.delete(live.id, owner=owner)
    assert (deleted.status, deleted.by) == ("cancelled", "python")
