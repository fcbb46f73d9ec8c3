"""The profile section of ``docs/benchmarks.md``: in-process statement counts per execution
phase and per instant step, launch statements, message bytes, Redis commands, py-spy shares.
"""

from __future__ import annotations

from typing import Any

from bench.fmt import get, num, table


def _phases(per: dict[str, Any]) -> str:
    rows = []
    for label, key in (("as shipped", "as_is"), ("`Run.steps` lazy='select'", "steps_lazy_select")):
        for links, phases in (per.get(key) or {}).items():
            for phase in ("start", "poll", "finish"):
                data = phases.get(phase)
                if not data:
                    continue
                rows.append(
                    [
                        label,
                        links,
                        phase,
                        num(data["statements"]),
                        num(data["transactions"]),
                        num(get(data, "max", "statements")),
                        num(data["provider_statements"]),
                        num(data.get("provider_transactions")),
                        num(data["step_selects"]),
                        num(data["round_trips"]),
                        num(data["seconds"], "ms"),
                    ]
                )
    return table(
        [
            "mapping",
            "links in run",
            "execution",
            "engine statements",
            "engine transactions",
            "most statements",
            "provider statements",
            "provider transactions",
            "SELECTs on steps",
            "PostgreSQL round trips",
            "time (in-process)",
        ],
        rows,
    )


def _instant(item: dict[str, Any]) -> str:
    rows = []
    for label, key in (
        ("every step", "all"),
        ("inside a segment (the message carries the next link)", "inside_segment"),
        ("last link of a segment (arms the next segment)", "segment_end"),
        ("last step of the run", "last"),
    ):
        data = item.get(key)
        if not data:
            continue
        rows.append(
            [
                label,
                str(data["steps"]),
                num(data["executions"]),
                f"{num(data['transactions'])} / {num(data['max']['transactions'])}",
                f"{num(data['statements'])} / {num(data['max']['statements'])}",
                num(data["provider_statements"]),
                num(data["round_trips"]),
                num(data["seconds"], "ms"),
            ]
        )
    return table(
        [
            f"instant steps of a {item['links']}-link run",
            "steps",
            "executions (median)",
            "engine transactions (median / max)",
            "engine statements (median / max)",
            "provider statements",
            "round trips",
            "time (in-process)",
        ],
        rows,
    )


def _launch(launch: dict[str, Any]) -> str:
    return table(
        ["launch of a workflow of", "statements", "transactions", "round trips", "time"],
        [
            [
                f"{links} steps",
                num(d["statements"]),
                num(d["transactions"]),
                num(d["round_trips"]),
                num(d["seconds"], "ms"),
            ]
            for links, d in launch.items()
        ],
    )


def messages(report: dict[str, Any]) -> str:
    """Bytes per message and per step, as the engine publishes them."""
    parts: list[str] = []
    item = report.get("messages") or {}
    per = item.get("per_step")
    if per:
        rows = [
            [
                f"{links} instant steps",
                str(data["messages"]),
                f"{data['total_bytes']:,}",
                f"{data['bytes_per_step']:,.0f}",
                f"{data['max_message_bytes']:,}" if data["max_message_bytes"] else "n/a",
            ]
            for links, data in per.items()
            if links.isdigit()
        ]
        text = table(
            ["run", "messages published", "bytes", "bytes per step", "largest message"], rows
        )
        retry = get(per, "poll_retry", "retry_bytes")
        if retry:
            text += (
                f"\n\nA step polling inside a {per['poll_retry']['links_in_run']}-link run: "
                f"each retry message {num(retry['p50'])} B (max {num(retry['max'])}, "
                f"{retry['n']} retries); its first message "
                f"{num(per['poll_retry']['first_message_bytes'])} B. Bytes per step at 200 "
                f"links over 2 links: {num(per.get('ratio_200_to_2'), 'x')}."
            )
        parts.append(text)
    segments = item.get("segments")
    if segments:
        parts.append(
            table(
                [
                    f"run of (segments of ≤ {segments['segment_links']} links)",
                    "segments",
                    "first segment message",
                    "largest",
                    "all segment sends",
                ],
                [
                    [
                        f"{links} links",
                        str(d["segments"]),
                        f"{d['first_bytes']:,}",
                        f"{d['max_bytes']:,}",
                        f"{d['total_bytes']:,}",
                    ]
                    for links, d in segments.items()
                    if links.isdigit()
                ],
            )
        )
    old = get(report, "profile", "message_bytes")
    if old:
        parts.append(
            table(
                ["links left in the chain", "bytes of the step message (re-sent by every poll)"],
                [[links, f"{size:,}"] for links, size in old.items()],
            )
        )
    return "\n\n".join(parts) or "_not measured (see errors)_"


def render(report: dict[str, Any]) -> str:
    """Every profile table this report has."""
    prof = report.get("profile") or {}
    parts: list[str] = []
    if prof.get("statements"):
        parts.append(_phases(prof["statements"]))
    if prof.get("instant"):
        parts.append(_instant(prof["instant"]))
    if prof.get("launch_statements"):
        parts.append(_launch(prof["launch_statements"]))
    redis_side = prof.get("redis")
    if redis_side:
        parts.append(
            table(
                ["Redis commands per execution (MONITOR)", "count", "commands"],
                [
                    [
                        label,
                        num(data["commands_per_execution"]),
                        ", ".join(f"{k} {v}" for k, v in list(data["by_command"].items())[:8]),
                    ]
                    for label, data in redis_side.items()
                ],
            )
        )
    spy = prof.get("worker_py_spy")
    if spy and "share" in spy:
        parts.append(
            table(
                ["worker time in (py-spy, 200-link run, inclusive)", "share of samples"],
                [[label, num(share, "%")] for label, share in spy["share"].items()],
            )
            + f"\n\n{spy['samples']} samples over both pool processes."
        )
    return "\n\n".join(parts) or "_not measured (see errors)_"
