"""``bench.upkeep`` (issue 13's closing figures) works: a tiny run on SQLite seeds, prunes under
a concurrent sweep and scrape, checks what survived, reads and downloads an artifact, and
prints its tables. The 100k run on PostgreSQL is ``make upkeep-bench``."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from bench import upkeep, upkeep_rows
from orchestration.core.db import dispose_engines, upgrade, utcnow


def test_a_tiny_run_measures_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "upkeep.json"
    result = upkeep.main(
        [
            "--database-url",
            "sqlite://",
            "--runs",
            "200",
            "--recent",
            "20",
            "--live",
            "10",
            "--samples",
            "3",
            "--repeat",
            "3",
            "--downloads",
            "2",
            "--artifact-mb",
            "1",
            "--json",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["prune"]["runs"] == 200
    before, after = result["sizes"]["before"]["rows"], result["sizes"]["after_prune"]["rows"]
    assert (before["runs"], after["runs"]) == (230, 30)
    assert (before["steps"], after["steps"]) == (690, 90)
    assert before["run_events"] == 200 * 6 + 20 * 6 + 10 and after["run_events"] == 130
    assert 0 < after["artifacts"] < before["artifacts"]  # the recent runs' shared ones stay
    assert not any(result["checks"].values())
    load = result["load"]
    assert load["idle"]["n"] == 3 and load["during_prune"]["n"] >= 1
    assert load["during_cpu_hog"]["n"] >= 1 and load["busy_passes"] == 0
    for ratios in (load["during_prune_ratio"], load["during_cpu_hog_ratio"]):
        assert ratios["sweep_median"] > 0 and ratios["metrics_median"] > 0
    reads = result["reads"]
    assert reads["artifact_bytes"] == 1_000_000 and reads["download_mb_s"] > 0
    printed = capsys.readouterr().out
    assert "prune: 200 runs in 1 batches" in printed and "download MB/s" in printed


def test_a_prune_that_leaves_an_old_run_fails_loudly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'seeded.db'}"
    upgrade(url)
    now = utcnow()
    seeded = upkeep_rows.seed(url, old=10, recent=2, live=1, now=now)
    try:
        with pytest.raises(SystemExit, match="old_runs_left"):
            upkeep_rows.check(url, now - timedelta(days=30), seeded)
    finally:
        dispose_engines()


def test_make_bench_keeps_the_upkeep_section_it_does_not_measure() -> None:
    from bench import report

    page = "# B\n\n## 1. Steps\nold\n\n## Upkeep: prune and artifacts\nfigures\n\n## Later\nx\n"
    assert report.kept_sections(page) == "## Upkeep: prune and artifacts\nfigures\n"
    assert report.kept_sections("# B\n\n## 1. Steps\n") == ""
