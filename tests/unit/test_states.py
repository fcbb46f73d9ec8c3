"""The transition tables in ``orchestration/core/states.py`` are consistent, and the docs and the
schema agree with them."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import text

from orchestration.core.db import get_engine
from orchestration.core.settings import Settings
from orchestration.core.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    STEP_END_FOR_RUN_END,
    STEP_LIVE,
    STEP_TERMINAL,
    STEP_TRANSITIONS,
    STOP_REASONS,
    ParkReason,
    RunStatus,
    StepStatus,
    StopReason,
    run_sources,
    step_sources,
)

ROOT = Path(__file__).resolve().parents[2]
S = TypeVar("S", bound=StrEnum)


def _reachable(table: Mapping[S, frozenset[S]], start: S) -> set[S]:
    seen = {start}
    queue = deque([start])
    while queue:
        for nxt in table[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def test_run_statuses_split_into_live_and_terminal() -> None:
    assert set(RunStatus) == RUN_LIVE | RUN_TERMINAL
    assert not RUN_LIVE & RUN_TERMINAL
    assert set(RUN_TRANSITIONS) == set(RunStatus)


def test_step_statuses_split_into_live_and_terminal() -> None:
    assert set(StepStatus) == STEP_LIVE | STEP_TERMINAL
    assert not STEP_LIVE & STEP_TERMINAL
    assert set(STEP_TRANSITIONS) == set(StepStatus)


@pytest.mark.parametrize("status", sorted(RUN_TERMINAL))
def test_terminal_run_status_has_no_way_out(status: RunStatus) -> None:
    assert RUN_TRANSITIONS[status] == frozenset()


@pytest.mark.parametrize("status", sorted(STEP_TERMINAL))
def test_terminal_step_status_has_no_way_out(status: StepStatus) -> None:
    assert STEP_TRANSITIONS[status] == frozenset()


@pytest.mark.parametrize("status", sorted(RUN_LIVE))
def test_every_live_run_status_can_reach_every_terminal_cause(status: RunStatus) -> None:
    reachable = _reachable(RUN_TRANSITIONS, status)
    assert reachable & RUN_TERMINAL, f"{status} cannot end"
    # Whatever else happens, a live run can always be cancelled, timed out or interrupted:
    # the sweeper and ``cancel`` rely on it.
    for forced in (RunStatus.CANCELLED, RunStatus.TIMED_OUT, RunStatus.INTERRUPTED):
        assert forced in RUN_TRANSITIONS[status], f"{status} -> {forced} must be direct"


@pytest.mark.parametrize("status", sorted(STEP_LIVE))
def test_every_live_step_status_can_reach_a_terminal_one(status: StepStatus) -> None:
    assert _reachable(STEP_TRANSITIONS, status) & STEP_TERMINAL, f"{status} cannot end"


def test_no_transition_is_a_self_loop() -> None:
    for run_status, targets in RUN_TRANSITIONS.items():
        assert run_status not in targets
    for step_status, step_targets in STEP_TRANSITIONS.items():
        assert step_status not in step_targets


def test_queued_is_the_only_run_status_nothing_moves_into() -> None:
    assert {status for status in RunStatus if not run_sources(status)} == {RunStatus.QUEUED}
    assert {status for status in StepStatus if not step_sources(status)} == {StepStatus.PENDING}


@pytest.mark.parametrize("target", list(RunStatus))
def test_run_sources_agree_with_the_table(target: RunStatus) -> None:
    expected = {source for source in RunStatus if target in RUN_TRANSITIONS[source]}
    assert run_sources(target) == expected
    assert not run_sources(target) & RUN_TERMINAL


@pytest.mark.parametrize("target", list(StepStatus))
def test_step_sources_agree_with_the_table(target: StepStatus) -> None:
    expected = {source for source in StepStatus if target in STEP_TRANSITIONS[source]}
    assert step_sources(target) == expected
    assert not step_sources(target) & STEP_TERMINAL


def test_every_terminal_run_status_has_stop_reasons() -> None:
    assert set(STOP_REASONS) == set(RUN_TERMINAL)
    for status, reasons in STOP_REASONS.items():
        assert reasons, f"{status} has no stop reason"


def test_stop_reasons_are_disjoint_and_each_is_used_once() -> None:
    flat = [reason for reasons in STOP_REASONS.values() for reason in reasons]
    assert len(flat) == len(set(flat)), "a stop reason belongs to two terminal statuses"
    assert set(flat) == set(StopReason), "a stop reason goes with no terminal status"


def test_closing_a_run_can_end_each_of_its_live_steps() -> None:
    """``closing.end_run`` moves pending steps to skipped (cancelled for a cancelled run) and
    started ones to ``STEP_END_FOR_RUN_END``; every such move must be in the step table."""
    assert set(STEP_END_FOR_RUN_END) == set(RUN_TERMINAL)
    assert set(STEP_END_FOR_RUN_END.values()) <= STEP_TERMINAL
    for to in RUN_TERMINAL:
        pending_end = StepStatus.CANCELLED if to is RunStatus.CANCELLED else StepStatus.SKIPPED
        assert pending_end in STEP_TRANSITIONS[StepStatus.PENDING]
        if to is RunStatus.COMPLETED:
            continue  # a run completes only after its last step did
        for started in STEP_LIVE - {StepStatus.PENDING}:
            assert STEP_END_FOR_RUN_END[to] in STEP_TRANSITIONS[started], (to, started)


@pytest.mark.parametrize("enum", [RunStatus, StepStatus, StopReason, ParkReason])
def test_values_are_short_snake_case(enum: type[StrEnum]) -> None:
    for member in enum:
        assert re.fullmatch(r"[a-z][a-z_]{1,19}", member.value), member
        assert member.value == member.name.lower()


def test_status_columns_fit_every_value() -> None:
    # runs.status / steps.status are String(20), stop_reason / park_reason String(40).
    assert max(len(s.value) for s in [*RunStatus, *StepStatus]) <= 20
    assert max(len(r.value) for r in [*StopReason, *ParkReason]) <= 40


def test_migrated_live_index_matches_the_live_statuses(settings: Settings) -> None:
    """The partial index the sweeper reads through must cover exactly the live statuses."""
    read = {
        "sqlite": "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'ix_runs_live'",
        "postgresql": "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_runs_live'",
    }
    with get_engine(settings.database_url).connect() as connection:
        sql = connection.execute(text(read[connection.dialect.name])).scalar_one()
    listed = set(re.findall(r"'([a-z_]+)'", sql))
    assert listed == {status.value for status in RUN_LIVE}


@pytest.mark.parametrize("enum", [RunStatus, StepStatus, StopReason, ParkReason])
def test_concepts_doc_names_every_value(enum: type[StrEnum]) -> None:
    doc = ROOT / "docs" / "concepts.md"
    if not doc.exists():
        pytest.skip("docs/concepts.md does not exist yet")
    body = doc.read_text(encoding="utf-8")
    missing = [
        member.value
        for member in enum
        if not re.search(rf"(?<![a-z_]){re.escape(member.value)}(?![a-z_])", body)
    ]
    assert not missing, f"docs/concepts.md does not mention {enum.__name__} values {missing}"
