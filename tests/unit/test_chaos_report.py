"""``python -m chaos --doc`` keeps one row per profile and broker in each generated table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.audit import MUST_BE_ZERO
from chaos.report import DOC_BEGIN, NET_BEGIN, NET_END, update_doc


def _report(available: bool, writes: int) -> dict[str, Any]:
    figures: dict[str, Any] = {name: 0 for name in MUST_BE_ZERO}
    figures.update(
        runs_launched=10, runs_terminal=10, worst_lateness_s=-1.5, writes_after_takeover=writes
    )
    faults = {
        "net_cut": {"injected": 2, "terminal_s": {"max": 9.5}},
        "beat_cut": {"injected": 1, "terminal_s": {"max": None}},
    }
    log = [{"kind": "net_cut", "runs": ["a", "b"]}, {"kind": "beat_cut", "runs": ["b"]}]
    return {
        "profile": "ci",
        "broker": {"kind": "redis"},
        "seed": 7,
        "figures": figures,
        "faults": faults,
        "fault_log": log,
        "partitions": {"available": available},
        "wall_seconds": 100.0,
        "started": "2026-12-02T01:00:00",
    }


def test_the_partition_row_is_written_and_replaced(tmp_path: Path) -> None:
    doc = tmp_path / "reliability.md"
    doc.write_text("# Reliability\n")
    update_doc(_report(True, 0), doc)
    update_doc(_report(True, 3), doc)
    text = doc.read_text()
    assert DOC_BEGIN in text
    table = text.split(NET_BEGIN, 1)[1].split(NET_END, 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ci |")]
    assert rows == ["| ci | redis | 7 | 2 | 0 | 0 | 1 | 2 | 3 | 0 | -1.50 | 9.50 | 2026-12-02 |"]


def test_a_run_without_namespaces_leaves_the_partition_table_alone(tmp_path: Path) -> None:
    doc = tmp_path / "reliability.md"
    update_doc(_report(False, 0), doc)
    assert NET_BEGIN not in doc.read_text()
