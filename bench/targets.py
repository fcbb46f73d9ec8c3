"""Issue 11's targets, each computed from a report: this run's, and the baseline's
(``bench/baseline/<commit>.json``, the engine before the change, measured on this machine).

Every ratio divides by a baseline or a peer measured in the same run as the figure it
divides. A figure a report lacks is "not measured", never a guess. The sweep at 1,000,000
terminal runs is skipped by ``--quick``; a report then carries the last full run's row
(``sweep_1m_carried``, with its commit and date) and says so.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fmt import get, num, table

#: Largest sweep the target speaks of.
SWEEP_TARGET_ROWS = 1_000_000
#: "Flat": the pass at 1M terminal runs at most this many times the pass with none.
SWEEP_FLAT = 1.25

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "≤": operator.le,
    "≥": operator.ge,
}


@dataclass(frozen=True)
class Figure:
    """One report's figure for a target: the compared ``value``, how it reads, and any side
    condition the target also asks (``also_ok``: a poll's statements *in one transaction*)."""

    value: float
    text: str
    shown: str
    also_ok: bool = True


@dataclass(frozen=True)
class Target:
    """A target the issues set (``op`` and ``limit``), or, with neither, a ratio the report
    states without one (the engine against a peer the issue names no goal for)."""

    key: str
    title: str
    op: str | None
    limit: float | None
    goal: str
    figure: Callable[[dict[str, Any]], Figure | None]

    @property
    def reported(self) -> bool:
        return self.op is None or self.limit is None

    def met(self, figure: Figure) -> bool | None:
        if self.op is None or self.limit is None:
            return None
        return figure.also_ok and _OPS[self.op](figure.value, self.limit)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 1 else num(value, "ms")


def _plural(count: float, word: str) -> str:
    return f"{num(count)} {word}{'' if count == 1 else 's'}"


def _finite(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _overhead(report: dict[str, Any]) -> dict[str, Any] | None:
    item: dict[str, Any] | None = get(report, "step_overhead", "200")
    return item


def _vs_director(report: dict[str, Any]) -> Figure | None:
    item, peer = _overhead(report), report.get("peer") or {}
    eng = get(item, "engine_per_link_s", "median")
    director = get(peer, "per_link_without_end_sleep_s", "median")
    if not _finite(eng, director) or get(peer, "links") != 200:
        return None
    value = eng / director
    return Figure(
        value,
        f"{num(eng, 'ms')} per link; director {num(director, 'ms')} "
        f"({num(get(peer, 'per_link_s', 'median'), 'ms')} with its 0.5 s end sleep)",
        f"{num(value, 'x')} director",
    )


def _vs_peer(key: str, short: str) -> Callable[[dict[str, Any]], Figure | None]:
    """The engine's cost per link against the ``peers`` entry ``key`` (same run, same
    number of links)."""

    def figure(report: dict[str, Any]) -> Figure | None:
        peer = get(report, "peers", key) or {}
        eng = get(_overhead(report), "engine_per_link_s", "median")
        theirs = get(peer, "per_link_s", "median")
        if not _finite(eng, theirs) or get(peer, "links") != 200:
            return None
        value = eng / theirs
        return Figure(
            value,
            f"{num(eng, 'ms')} per link; {short} {num(theirs, 'ms')}",
            f"{num(value, 'x')} {short}",
        )

    return figure


def _vs_bare(report: dict[str, Any]) -> Figure | None:
    item = _overhead(report)
    eng, bare = get(item, "engine_per_link_s", "median"), get(item, "bare_per_link_s", "median")
    if not _finite(eng, bare):
        return None
    return Figure(
        eng / bare,
        f"{num(eng, 'ms')} per link; bare chain {num(bare, 'ms')}",
        f"{num(eng / bare, 'x')} bare",
    )


def _executions(report: dict[str, Any]) -> Figure | None:
    value = get(_overhead(report), "engine_executions_per_link")
    if not _finite(value):
        return None
    in_process = get(report, "profile", "instant", "all", "max", "executions")
    extra = f"; in-process, at most {num(in_process)} per step" if _finite(in_process) else ""
    return Figure(
        round(value, 2), f"{num(value)} per step (worker trace){extra}", f"{num(value)} per step"
    )


def _poll(report: dict[str, Any]) -> Figure | None:
    poll = get(report, "profile", "statements", "as_is", "200", "poll")
    if not poll:
        return None
    statements, txns = poll["statements"], poll["transactions"]
    provider = poll.get("provider_transactions")
    side = f" (+{_plural(provider, 'provider transaction')})" if provider else ""
    # No transaction: the statement ran in autocommit (one statement is atomic by itself).
    within = _plural(txns, "transaction") if txns else "no transaction (autocommit)"
    text = (
        f"{_plural(statements, 'statement')} in {within}{side}, "
        f"{num(poll['round_trips'])} round trips"
    )
    shown = f"{num(statements)} in {num(txns)}" if txns else f"{num(statements)}, autocommit"
    return Figure(statements, text, shown, also_ok=txns <= 1)


def _instant(report: dict[str, Any]) -> Figure | None:
    steps = get(report, "profile", "instant", "all")
    if not steps:
        return None
    most, median = steps["max"]["transactions"], steps["transactions"]
    text = (
        f"{_plural(median, 'transaction')} per step (median), {num(most)} at most; "
        f"{_plural(steps['statements'], 'statement')}, {_plural(steps['executions'], 'execution')}"
    )
    return Figure(most, text, f"{num(most)} at most")


def _hop(report: dict[str, Any]) -> Figure | None:
    hop = get(report, "poll_hop", "0.01")
    if not hop or not _finite(hop.get("ratio")):
        return None
    text = (
        f"hop {num(hop['engine_hop_s']['median'], 'ms')}; "
        f"bare retry {num(hop['bare_hop_s']['median'], 'ms')}"
    )
    return Figure(hop["ratio"], text, f"{num(hop['ratio'], 'x')} bare")


def _rate(report: dict[str, Any]) -> Figure | None:
    sat = get(report, "scale", "saturation")
    if not sat or not _finite(sat.get("ratio_to_bare_retry")):
        return None
    text = (
        f"{num(sat['engine_polls_per_s'])} polls/s; bare retry loop "
        f"{num(sat['bare_retries_per_s'])}/s"
    )
    return Figure(sat["ratio_to_bare_retry"], text, f"{num(sat['ratio_to_bare_retry'], 'x')} bare")


def _lateness(report: dict[str, Any]) -> Figure | None:
    full = get(report, "scale", "at_scale")
    p99 = get(full, "engine", "lateness_pooled_s", "p99")
    if not full or not _finite(p99):
        return None
    bare = get(full, "bare", "lateness_pooled_s", "p99")
    text = (
        f"p99 {_seconds(p99)} ({full['runs']} runs every {full['interval_s']:g} s); "
        f"bare loops {_seconds(bare) if _finite(bare) else 'n/a'}"
    )
    return Figure(p99, text, _seconds(p99))


def _launch(report: dict[str, Any]) -> Figure | None:
    py = get(report, "launch", "python")
    if not py or not _finite(py.get("ratio_new_to_bare_send")):
        return None
    text = (
        f"p50 {num(py['new']['per_launch_s']['p50'], 'ms')}; bare 1-task chain send "
        f"{num(py['baseline_bare_chain_send']['per_launch_s']['p50'], 'ms')}"
    )
    ratio = py["ratio_new_to_bare_send"]
    return Figure(ratio, text, f"{num(ratio, 'x')} bare")


def _bytes(report: dict[str, Any]) -> Figure | None:
    per = get(report, "messages", "per_step")
    if not per or not _finite(per.get("ratio_200_to_2")):
        return None
    retry = get(per, "poll_retry", "retry_bytes", "max")
    text = (
        f"{per['200']['bytes_per_step']:,.0f} B per step at 200 links, "
        f"{per['2']['bytes_per_step']:,.0f} at 2; largest message "
        f"{per['200']['max_message_bytes']:,} B"
        + (f"; poll retry {retry:,.0f} B" if _finite(retry) else "")
    )
    return Figure(per["ratio_200_to_2"], text, f"{num(per['ratio_200_to_2'], 'x')} of 2 links")


def _cancel(report: dict[str, Any]) -> Figure | None:
    pg = get(report, "cancel", "postgresql")
    p50 = get(pg, "between_polls", "to_terminal_row_s", "p50")
    if not _finite(p50):
        return None
    busy = get(pg, "mid_poll", "to_terminal_row_s", "p50")
    return Figure(
        p50, f"between polls p50 {num(p50, 'ms')}; mid-poll p50 {num(busy, 'ms')}", num(p50, "ms")
    )


def _sweep(report: dict[str, Any]) -> Figure | None:
    rows = report.get("sweep") or []
    if not rows or not _finite(rows[0].get("median_seconds")):
        return None
    base = rows[0]["median_seconds"]
    largest = rows[-1]
    source = ""
    if largest["terminal"] < SWEEP_TARGET_ROWS:
        carried = report.get("sweep_1m_carried")
        if not carried:
            return None
        largest, base = carried["row"], carried.get("base_seconds", base)
        source = f" (from the full run of {carried['started'][:10]} on `{carried['commit'][:7]}`)"
    value = largest["median_seconds"] / base
    text = (
        f"{num(largest['median_seconds'], 'ms')} at {largest['terminal']:,} terminal runs, "
        f"{num(base, 'ms')} at none{source}"
    )
    return Figure(value, text, f"{num(value, 'x')} of none")


TARGETS = (
    Target("overhead_vs_director", "Step overhead, 200 instant steps, against celery-director "
           "per link (same run; director without its end sleep)", "<", 1.0, "< 1x",
           _vs_director),
    Target("overhead_vs_dbos_queue", "Step overhead, 200 instant steps, against DBOS Transact "
           "per step through its queue (same run)", None, None, "none set",
           _vs_peer("dbos_queue", "DBOS (queue)")),
    Target("overhead_vs_dbos_in_process", "Step overhead, 200 instant steps, against DBOS "
           "Transact per step called in-process (same run)", None, None, "none set",
           _vs_peer("dbos_in_process", "DBOS (in-process)")),
    Target("overhead_vs_prefect", "Step overhead, 200 instant steps, against Prefect 3 per task "
           "in a flow (same run)", None, None, "none set", _vs_peer("prefect", "Prefect")),
    Target("overhead_vs_bare", "Step overhead, 200 instant steps, against the bare chain link "
           "(aim)", "≤", 1.5, "≤ 1.5x", _vs_bare),
    Target("executions_per_step", "Executions per instant step", "≤", 1.0, "1", _executions),
    Target("poll_statements", "Statements per poll (in-process profile, 200-link run)", "≤",
           4.0, "≤ 4 in 1 transaction", _poll),
    Target("instant_transactions", "Transactions per instant step (in-process profile)", "≤",
           3.0, "≤ 3", _instant),
    Target("poll_hop", "Poll hop at a 10 ms countdown, against the bare retry hop", "≤", 1.3,
           "≤ 1.3x", _hop),
    Target("poll_rate", "Highest sustained poll rate, against the bare retry loop", "≥", 0.8,
           "≥ 0.8x", _rate),
    Target("lateness", "1,000 runs polling every 5 s: poll lateness p99", "<", 1.0, "< 1 s",
           _lateness),
    Target("launch", "Launch p50 (Python API), against a bare one-task chain send", "≤", 3.0,
           "≤ 3x", _launch),
    Target("message_bytes", "Message bytes per step, 200 links against 2 links", "≤", 1.2,
           "≤ 1.2x", _bytes),
    Target("cancel", "Cancel to terminal row p50, PostgreSQL", "<", 0.025, "< 25 ms", _cancel),
    Target("sweep", f"Sweep pass flat to 1M terminal runs (≤ {SWEEP_FLAT}x the pass with none)",
           "≤", SWEEP_FLAT, f"≤ {SWEEP_FLAT}x", _sweep),
)  # fmt: skip


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def load_baseline(path: Path) -> dict[str, Any] | None:
    """The baseline report with its ``supplement`` (figures the old bench did not take,
    measured with this bench's counters against the old engine) merged in."""
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return _merged(loaded, loaded.get("supplement") or {})


def _safe(target: Target, report: dict[str, Any] | None) -> Figure | None:
    if report is None:
        return None
    try:
        return target.figure(report)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def evaluate(report: dict[str, Any], baseline: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every target with its figure before (the baseline) and after (this run)."""
    rows = []
    for target in TARGETS:
        before, after = _safe(target, baseline), _safe(target, report)
        rows.append(
            {
                "key": target.key,
                "target": target.title,
                "goal": target.goal,
                "before": None
                if before is None
                else {"value": before.value, "text": before.text, "shown": before.shown},
                "after": None if after is None else {"value": after.value, "text": after.text},
                "vs_target": None if after is None else after.shown,
                "before_met": None if before is None else target.met(before),
                "met": None if after is None else target.met(after),
                "reported": target.reported,
            }
        )
    return rows


def _before(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "not measured"
    text, shown = figure["text"], figure.get("shown", "")
    return text if not shown or shown in text else f"{text}: **{shown}**"


def render(rows: list[dict[str, Any]], baseline_commit: str) -> str:
    """The Targets table of ``docs/benchmarks.md``."""
    cells = []
    for row in rows:
        if row.get("reported"):
            verdict = "reported, no target" if row["after"] else "not measured"
            against = row["vs_target"] or ""
        else:
            verdict = {True: "**met**", False: "**missed**", None: "not measured"}[row["met"]]
            against = f"{row['vs_target']} (target {row['goal']})" if row["vs_target"] else ""
        cells.append(
            [
                row["target"],
                _before(row["before"]),
                row["after"]["text"] if row["after"] else "not measured",
                against,
                verdict,
            ]
        )
    goals = [row for row in rows if not row.get("reported")]
    met = sum(1 for row in goals if row["met"])
    reported = len(rows) - len(goals)
    return (
        table(
            ["target", f"before (`{baseline_commit}`)", "after (this run)", "vs target", ""],
            cells,
        )
        + f"\n\n{met} of {len(goals)} targets met"
        + (
            f"; {reported} rows state the engine against a peer the issue sets no target for."
            if reported
            else "."
        )
    )
