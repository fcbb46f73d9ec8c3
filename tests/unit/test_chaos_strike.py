"""When a fault could have ended a worker's call, as the chaos audit reads it: a trapped kill
lasts until the trap lets the statement it caught go, since PostgreSQL stamps that statement
when it runs, after the kill."""

from __future__ import annotations

import pytest

from chaos.audit import TRAP_RELEASE_SETTLE, _strike
from chaos.faults import Fault


def test_a_trapped_kill_strikes_until_the_trap_lets_go() -> None:
    kill = Fault("kill_start", at=100.0, injected=True, until=100.004)
    start, end = _strike(kill)
    recorded = 100.002  # the killed start's row, stamped once the lock was released
    assert start <= recorded <= end


def test_a_trapped_kill_strikes_while_the_caught_statement_is_scheduled_after_the_release() -> None:
    """Full chaos on RabbitMQ: the killed worker's statement ran 2.8 ms after the harness
    read its clock on the release."""
    kill = Fault("kill_start", at=485.8717, injected=True, until=485.8722)
    start, end = _strike(kill)
    assert start <= 485.875 <= end
    assert end == pytest.approx(485.8722 + TRAP_RELEASE_SETTLE)


def test_a_kill_with_nothing_caught_is_an_instant() -> None:
    assert _strike(Fault("kill_random", at=100.0, injected=True)) == (100.0, 100.0)


def test_a_stop_strikes_until_the_worker_is_woken_or_healed() -> None:
    stop = Fault("stop_zombie", at=100.0, injected=True, until=113.0, healed=113.1)
    assert _strike(stop) == (100.0, 113.1)
