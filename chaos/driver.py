"""The caller side of a chaos run: launches the planned runs and acts on them afterwards.

It goes through the public :class:`~orchestration.service.Orchestrator`, as a web app would:
launch (idempotent by ``request_id``, so a launch retried after a dropped connection is the
same run), answer, and cancel. A cancel storm fires the same cancel from several threads of
this process and from helper processes at one wall-clock instant; a cancel race aims at the
moment the last step's turn completes. Every result is recorded for the audit.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.pool import Pool
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError

from chaos.duplicating import DuplicatingQueue
from chaos.population import RunPlan
from orchestration.core.errors import ConflictError, OrchestrationError, ValidationError
from orchestration.core.settings import Settings
from orchestration.providers.scripted import ScriptedProvider
from orchestration.runs.chains import plan_chain
from orchestration.runtime.celery_queue import client_queue
from orchestration.service import Orchestrator, is_terminal

T = TypeVar("T")

#: Threads and helper processes that fire one cancel storm.
STORM_THREADS = 3
STORM_PROCESSES = 2


def retrying(action: Callable[[], T], attempts: int = 6, pause: float = 0.3) -> T:
    """Retry a call that failed on a dropped database connection (the PostgreSQL fault)."""
    for attempt in range(attempts):
        try:
            return action()
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")


@dataclass
class CancelCall:
    """One cancel call and what it returned."""

    run_id: str
    kind: str
    graceful: bool
    started: float
    returned: float | None = None
    status: str | None = None
    error: str | None = None
    process: str = "thread"


@dataclass
class Records:
    """Everything the driver did, for the audit."""

    launched: dict[str, str] = field(default_factory=dict)
    launch_errors: dict[str, str] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    #: Launches refused as invalid or over a budget (label -> the error), written nowhere.
    refused: dict[str, str] = field(default_factory=dict)
    cancels: list[CancelCall] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)
    resends: list[str] = field(default_factory=list)
    races: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_PROCESS_ORCH: Orchestrator | None = None


def _process_init(values: dict[str, Any]) -> None:
    global _PROCESS_ORCH
    settings = Settings.model_validate(values)
    _PROCESS_ORCH = Orchestrator(settings, client_queue(settings))


def _process_cancel(run_id: str, owner: str, at: float) -> tuple[float, float, str | None, str]:
    """A helper process's cancel at wall time ``at``: (started, returned, status, error)."""
    assert _PROCESS_ORCH is not None
    orch = _PROCESS_ORCH
    time.sleep(max(0.0, at - time.time()))
    started = time.time()
    try:
        record = retrying(lambda: orch.cancel(run_id, owner=owner))
        return started, time.time(), record.status, ""
    except (OrchestrationError, DBAPIError) as exc:
        return started, time.time(), None, f"{type(exc).__name__}: {exc}"[:300]


class Driver:
    """Launches the plan on schedule and runs the follow-ups in a thread pool."""

    def __init__(self, settings: Settings, rng: random.Random) -> None:
        self.settings = settings
        self.rng = rng
        dispatcher = client_queue(settings)
        self.orch = Orchestrator(settings, dispatcher)
        self.twice = Orchestrator(settings, DuplicatingQueue(dispatcher))
        self.dispatcher = dispatcher
        self.records = Records()
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(12, thread_name_prefix="chaos-driver")
        self.futures: list[Future[Any]] = []
        context = multiprocessing.get_context("spawn")
        self.processes: Pool = context.Pool(
            STORM_PROCESSES, _process_init, (settings.model_dump(),)
        )
        self.scripted = ScriptedProvider(settings)

    # -- schedule ---------------------------------------------------------------------------
    def run(self, plans: list[RunPlan], started: float, stop: threading.Event) -> None:
        """Launch each plan at ``started + plan.at`` (wall clock), then its follow-up."""
        for plan in plans:
            delay = started + plan.at - time.time()
            if delay > 0 and stop.wait(delay):
                return
            self.futures.append(self.pool.submit(self._life, plan))

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for future in self.futures:
            future.result(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.processes.terminate()
        self.processes.join()

    # -- one run ----------------------------------------------------------------------------
    def _life(self, plan: RunPlan) -> None:
        if self.stop.is_set():
            return
        run_id = self._launch(plan)
        if run_id is None or plan.follow_up is None:
            return
        if plan.follow_up in ("answer", "approve"):
            self._answer(plan, run_id)
        elif plan.follow_up == "storm":
            time.sleep(plan.follow_at)
            self.storm(run_id, plan.owner, kind="storm")
        elif plan.follow_up == "graceful":
            time.sleep(plan.follow_at)
            self._cancel(run_id, plan.owner, kind="graceful", graceful=True)
        elif plan.follow_up == "race":
            self._race(plan, run_id)
        elif plan.follow_up == "resend":
            time.sleep(plan.follow_at)
            self.resend(run_id, plan.owner)

    def _launch(self, plan: RunPlan) -> str | None:
        orch = self.twice if plan.twice else self.orch
        try:
            record = retrying(
                lambda: orch.launch(
                    plan.workflow,
                    plan.args,
                    owner=plan.owner,
                    request_id=plan.label,
                    concurrency_key=plan.concurrency_key,
                    on_conflict=plan.on_conflict,
                )
            )
        except ConflictError:
            with self.records.lock:
                self.records.rejected.append(plan.label)
            return None
        except ValidationError as exc:
            with self.records.lock:
                self.records.refused[plan.label] = str(exc)[:300]
            return None
        except Exception as exc:  # recorded and audited: a launch must not be lost silently
            with self.records.lock:
                self.records.launch_errors[plan.label] = f"{type(exc).__name__}: {exc}"[:300]
            return None
        with self.records.lock:
            self.records.launched[plan.label] = record.id
        return record.id

    def _answer(self, plan: RunPlan, run_id: str) -> None:
        """Answer the human park (``answer``), or decide the approval step (``approve``),
        once the run waits for it."""
        reason = "approval" if plan.follow_up == "approve" else "human"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stop.is_set():
            record = retrying(lambda: self.orch.get(run_id, owner=plan.owner))
            if is_terminal(record):
                self._note_answer(run_id, f"ended {record.status} before parking")
                return
            if record.status == "parked" and record.park_reason == reason:
                break
            time.sleep(0.3)
        else:
            self._note_answer(run_id, f"never parked for {reason}")
            return
        time.sleep(self.rng.uniform(0.0, 2.0))
        try:
            if reason == "approval":
                retrying(lambda: self.orch.approve(run_id, "review", owner=plan.owner))
            else:
                retrying(
                    lambda: self.orch.answer(run_id, "s1", {"approved": True}, owner=plan.owner)
                )
            self._note_answer(run_id, "answered")
        except ConflictError as exc:
            self._note_answer(run_id, f"conflict: {exc}"[:200])

    def _note_answer(self, run_id: str, outcome: str) -> None:
        with self.records.lock:
            self.records.answers[run_id] = outcome

    def _race(self, plan: RunPlan, run_id: str) -> None:
        """Cancel at the moment the last step's turn completes (give or take a poll)."""
        last = plan.workflow["steps"][-1]
        seconds = float(last["with"]["states"][0][1])
        key = f"{run_id}:{last['id']}:1"
        deadline = time.monotonic() + 40
        started_at = None
        while time.monotonic() < deadline and started_at is None and not self.stop.is_set():
            rows = retrying(lambda: self.scripted.turns(key))
            started_at = rows[0]["started_at"] if rows and rows[0]["started_at"] else None
            if started_at is None:
                record = retrying(lambda: self.orch.get(run_id, owner=plan.owner))
                if is_terminal(record):
                    return
                time.sleep(0.1)
        if started_at is None:
            return
        aim = started_at.timestamp() + seconds + self.rng.uniform(-0.3, 0.5)
        time.sleep(max(0.0, aim - time.time()))
        with self.records.lock:
            self.records.races[run_id] = aim
        self._cancel(run_id, plan.owner, kind="race", graceful=False)

    # -- cancels and duplicates -------------------------------------------------------------
    def _cancel(self, run_id: str, owner: str, *, kind: str, graceful: bool) -> CancelCall:
        call = CancelCall(run_id, kind, graceful, time.time())
        try:
            record = retrying(lambda: self.orch.cancel(run_id, owner=owner, graceful=graceful))
            call.status = record.status
        except (OrchestrationError, DBAPIError) as exc:
            call.error = f"{type(exc).__name__}: {exc}"[:300]
        call.returned = time.time()
        with self.records.lock:
            self.records.cancels.append(call)
        return call

    def cancel_later(self, run_id: str, owner: str) -> None:
        """A graceful cancel from the pool (a fault waits for the worker that applies it)."""
        self.futures.append(
            self.pool.submit(self._cancel, run_id, owner, kind="fault", graceful=True)
        )

    def storm(self, run_id: str, owner: str, *, kind: str) -> None:
        """The same hard cancel from several threads and processes at one instant."""
        at = time.time() + 0.3
        remote = [
            self.processes.apply_async(_process_cancel, (run_id, owner, at))
            for _ in range(STORM_PROCESSES)
        ]

        def fire() -> CancelCall:
            time.sleep(max(0.0, at - time.time()))
            return self._cancel(run_id, owner, kind=kind, graceful=False)

        threads = [threading.Thread(target=fire) for _ in range(STORM_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for result in remote:
            try:
                started, returned, status, error = result.get(timeout=60)
            except Exception as exc:
                started, returned, status, error = at, time.time(), None, repr(exc)[:300]
            call = CancelCall(run_id, kind, False, started, returned, status, error or None)
            call.process = "process"
            with self.records.lock:
                self.records.cancels.append(call)

    def resend(self, run_id: str, owner: str) -> None:
        """Send the run's chain again from its current step and tick: a duplicate delivery of
        the message that is in flight (as a redelivery racing the original would be)."""
        record = retrying(lambda: self.orch.get(run_id, owner=owner))
        if is_terminal(record):
            return
        step = record.steps[record.current_step]
        plan = plan_chain(run_id, step.index, len(record.steps), step.polls)
        self.dispatcher.send_chain(plan)
        with self.records.lock:
            self.records.resends.append(run_id)
