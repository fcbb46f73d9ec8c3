"""The chaos report: JSON for machines, a table for the terminal, a row for the docs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.audit import MUST_BE_ZERO

DOC_BEGIN = "<!-- chaos:results:begin -->"
DOC_END = "<!-- chaos:results:end -->"
DOC_HEADER = (
    "| profile | broker | seed | runs launched | terminal | missed deadline | worst lateness (s)"
    " | terminal exits | extra turn starts | cancels non-terminal | lost | faults injected"
    " | wall time (s) | date |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
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
    bad = failures(report)
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


def update_doc(report: dict[str, Any], path: Path) -> None:
    """Replace this profile and broker's row in the results table of ``path``."""
    text = path.read_text() if path.exists() else ""
    if DOC_BEGIN not in text:
        text = text.rstrip() + f"\n\n{DOC_BEGIN}\n{DOC_HEADER}\n{DOC_END}\n"
    head, rest = text.split(DOC_BEGIN, 1)
    body, tail = rest.split(DOC_END, 1)
    rows = [line for line in body.strip().splitlines()[2:] if line.startswith("|")]
    key = f"| {report['profile']} | {report['broker']['kind']} |"
    rows = [row for row in rows if not row.startswith(key)] + [doc_row(report)]
    rows.sort()
    block = "\n".join([DOC_HEADER, *rows])
    path.write_text(f"{head}{DOC_BEGIN}\n{block}\n{DOC_END}{tail}")
