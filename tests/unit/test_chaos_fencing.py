"""The chaos audit's partition check (``chaos.fencing``) counts a cut worker's late writes."""

from __future__ import annotations

from chaos.fencing import Cut, Written, cuts_of, writes_after_takeover

CUT = Cut("chaos-net", at=100.0, runs=("r1",))


def _w(
    at: float, app: str, table: str = "runs", *, fence: bool = False, rearm: bool = False
) -> Written:
    return Written(table, "r1", fence, rearm, at, app)


def test_a_write_by_the_cut_worker_after_a_rearm_is_counted() -> None:
    writes = {
        "r1": [_w(99.0, "chaos-net"), _w(110.0, "chaos-w1", rearm=True), _w(115.0, "chaos-net")]
    }
    found = writes_after_takeover(writes, [CUT])
    assert len(found) == 1
    assert "5.000s after the run was taken over" in found[0]


def test_a_write_after_another_worker_fenced_the_step_is_counted() -> None:
    writes = {
        "r1": [
            _w(111.0, "chaos-w2", "steps", fence=True),
            _w(116.0, "chaos-net", "run_events"),
            _w(117.0, "chaos-net", "steps"),
        ]
    }
    assert len(writes_after_takeover(writes, [CUT])) == 2


def test_writes_before_the_takeover_or_after_fencing_again_are_not_counted() -> None:
    writes = {
        "r1": [
            _w(101.0, "chaos-net"),  # cut, not yet taken over: its own run still
            _w(110.0, "chaos-w1", rearm=True),
            _w(112.0, "chaos-net", "steps", fence=True),  # a delivery it held won the fence
            _w(113.0, "chaos-net"),
        ]
    }
    assert writes_after_takeover(writes, [CUT]) == []


def test_other_workers_and_other_runs_are_not_counted() -> None:
    writes = {
        "r1": [_w(110.0, "chaos-w1", rearm=True), _w(111.0, "chaos-w2")],
        "r2": [_w(110.0, "chaos-w1", rearm=True), _w(111.0, "chaos-net")],
    }
    assert writes_after_takeover(writes, [CUT]) == []


def test_the_worker_a_later_fault_starts_is_not_the_cut_one() -> None:
    """Each partition fault starts a namespaced worker of its own (``chaos-net<n>``): the
    worker of the next fault, which may take the stop task of a run the cut one held (full
    chaos, Redis, 2026-12-06: a stop written 18 s after the takeover by the next fault's
    worker, counted while both were ``chaos-net``), is another process."""

    class Fault:
        kind, injected, victim, at, runs = "net_cut", True, "net3", 100.0, ["r1"]

    [cut] = cuts_of([Fault()])
    writes = {
        "r1": [
            _w(110.0, "chaos-w1", rearm=True),
            _w(118.0, "chaos-net4", "steps"),
            _w(119.0, "chaos-net3", "steps"),
        ]
    }
    [found] = writes_after_takeover(writes, [cut])
    assert "chaos-net3 wrote steps" in found
