"""The chaos report: JSON for machines, a table for the terminal, a row for the docs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.audit import MUST_BE_ZERO
from chaos.partitions import PARTITION_KINDS

DOC_BEGIN = "<!-- chaos:results:begin -->"
DOC_END = "<!-- chaos:results:end -->"
DOC_HEADER = (
    "| profile | broker | seed | runs launched | terminal | missed deadline | worst lateness (s)"
    " | terminal exits | extra turn starts | cancels non-terminal | lost | faults injected"
    " | wall time (s) | date |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


NET_BEGIN = "<!-- chaos:partitions:begin -->"
NET_END = "<!-- chaos:partitions:end -->"
NET_HEADER = (
    "| profile | broker | seed | net_cut | net_oneway | net_slow | beat_cut | runs struck"
    " | writes after takeover | missed deadline | worst lateness (s) | slowest end after a"
    " partition (s) | date |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def failures(report: dict[str, Any]) -> dict[str, int]:
    """The must-be-zero figures that are not zero."""
    figures = report["figures"]
    return {name: figures[name] for name in MUST_BE_ZERO if figures.get(name)}


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def table(report: dict[str, Any]) -> str:
    """The figures and the per-fault convergence as plain text."""
    figures = report["figures"]
    lines = [
        f"chaos: profile {report['profile']}, seed {report['seed']}, broker "
        f"{report['broker']['kind']} ({report['broker']['mode']}), "
        f"{figures['runs_launched']} runs, {report['wall_seconds']:.1f}s",
        "",
        f"{'figure':34} {'value':>10}  must be 0",
    ]
    for name, value in figures.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        mark = ("FAIL" if value else "ok") if name in MUST_BE_ZERO else ""
        lines.append(f"{name:34} {_fmt(value):>10}  {mark}")
    lines += [
        "",
        f"{'fault kind':16} {'injected':>8} {'no target':>9}  "
        f"{'recover p50/p90/max (s)':>26}  {'terminal p50/p90/max (s)':>26}",
    ]
    for kind, data in report["faults"].items():
        recover, ended = data["recover_s"], data["terminal_s"]
        lines.append(
            f"{kind:16} {data['injected']:>8} {data['no_target']:>9}  "
            f"{_fmt(recover['p50']):>8}/{_fmt(recover['p90']):>7}/{_fmt(recover['max']):>8}  "
            f"{_fmt(ended['p50']):>8}/{_fmt(ended['p90']):>7}/{_fmt(ended['max']):>8}"
        )
    latency = report.get("plain_latency")
    if latency:
        alone, beside = latency["plain_alone"], latency["beside_hostile"]
        lines += [
            "",
            f"plain step latency p50/p99 (s): alone {_fmt(alone['p50'])}/{_fmt(alone['p99'])}, "
            f"beside hostile owners {_fmt(beside['p50'])}/{_fmt(beside['p99'])}; "
            f"ratio p50 {_fmt(latency['p50_ratio'])}, p90 {_fmt(latency['p90_ratio'])}, "
            f"p99 {_fmt(latency['p99_ratio'])}",
        ]
    bad = report.get("failures", failures(report))
    lines += ["", "RESULT: " + ("FAIL " + json.dumps(bad) if bad else "all must-be-zero are 0")]
    return "\n".join(lines)


def doc_row(report: dict[str, Any]) -> str:
    figures = report["figures"]
    extra_turns = sum(
        figures[name]
        for name in (
            "turns_duplicated",
            "turns_unrecorded_attempt",
            "turns_restarted_unexplained",
            "turns_started_after_cancel",
        )
    )
    injected = sum(kind["injected"] for kind in report["faults"].values())
    cells = [
        report["profile"],
        report["broker"]["kind"],
        str(report["seed"]),
        str(figures["runs_launched"]),
        str(figures["runs_terminal"]),
        str(figures["deadline_misses"]),
        _fmt(figures["worst_lateness_s"]),
        str(figures["terminal_exits"]),
        str(extra_turns),
        str(figures["cancels_returned_nonterminal"]),
        str(figures["runs_lost"]),
        str(injected),
        f"{report['wall_seconds']:.0f}",
        report["started"][:10],
    ]
    return "| " + " | ".join(cells) + " |"


def net_row(report: dict[str, Any]) -> str:
    """The partition faults' row: injected per kind, and the figures they bear on."""
    figures, faults = report["figures"], report["faults"]
    net = [fault for fault in report["fault_log"] if fault["kind"] in PARTITION_KINDS]
    struck = {run for fault in net for run in fault["runs"]}
    slowest = [
        faults[kind]["terminal_s"]["max"]
        for kind in PARTITION_KINDS
        if kind in faults and faults[kind]["terminal_s"]["max"] is not None
    ]
    cells = [
        report["profile"],
        report["broker"]["kind"],
        str(report["seed"]),
        *(str(faults.get(kind, {}).get("injected", 0)) for kind in PARTITION_KINDS),
        str(len(struck)),
        str(figures["writes_after_takeover"]),
        str(figures["deadline_misses"]),
        _fmt(figures["worst_lateness_s"]),
        _fmt(max(slowest) if slowest else None),
        report["started"][:10],
    ]
    return "| " + " | ".join(cells) + " |"


def _replace_row(text: str, begin: str, end: str, header: str, key: str, row: str) -> str:
    """``text`` with the table between ``begin`` and ``end`` holding ``row`` in place of the
    row that starts with ``key`` (the table is appended when missing)."""
    if begin not in text:
        text = text.rstrip() + f"\n\n{begin}\n{header}\n{end}\n"
    head, rest = text.split(begin, 1)
    body, tail = rest.split(end, 1)
    rows = [line for line in body.strip().splitlines()[2:] if line.startswith("|")]
    rows = sorted([line for line in rows if not line.startswith(key)] + [row])
    block = "\n".join([header, *rows])
    return f"{head}{begin}\n{block}\n{end}{tail}"


def update_doc(report: dict[str, Any], path: Path) -> None:
    """Replace this profile and broker's row in the results table of ``path``, and in its
    partition table when the run had partition faults."""
    text = path.read_text() if path.exists() else ""
    key = f"| {report['profile']} | {report['broker']['kind']} |"
    text = _replace_row(text, DOC_BEGIN, DOC_END, DOC_HEADER, key, doc_row(report))
    if report.get("partitions", {}).get("available"):
        text = _replace_row(text, NET_BEGIN, NET_END, NET_HEADER, key, net_row(report))
    path.write_text(text)
