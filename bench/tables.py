"""The tables of items 1-6 in ``docs/benchmarks.md``, one function per item."""

from __future__ import annotations

from typing import Any

from bench.fmt import num, ratio, table, verdict
from bench.peers import table as peer_table


def overhead(report: dict[str, Any]) -> str:
    item = report.get("step_overhead")
    peers = peer_table.render(report)
    if not item:
        return "_not measured (see errors)_" + (f"\n\n{peers}" if peers else "")
    rows = []
    for links, data in sorted(item.items(), key=lambda kv: int(kv[0])):
        rows.append(
            [
                str(links),
                num(data["engine_per_link_s"]["median"], "ms"),
                num(data["bare_per_link_s"]["median"], "ms"),
                num(data["ratio"], "x"),
                verdict(data["ratio"], data["target_ratio"]),
                num(data["engine_executions_per_link"]),
                num(data["engine_execution_busy_s"]["p50"], "ms"),
                num(data["bare_execution_busy_s"]["p50"], "ms"),
                f"{data['engine_per_link_s']['n']} / {data['bare_per_link_s']['n']}",
            ]
        )
    text = table(
        [
            "links",
            "engine per link",
            "bare Celery per link",
            "ratio",
            "target",
            "executions per link",
            "engine execution (p50)",
            "bare execution (p50)",
            "repeats (engine / bare)",
        ],
        rows,
    )
    return text + (f"\n\n{peers}" if peers else "")


def hops(report: dict[str, Any]) -> str:
    item = report.get("poll_hop")
    if not item:
        return "_not measured (see errors)_"
    rows = [
        [
            num(data["countdown_s"], "ms"),
            num(data["engine_hop_s"]["median"], "ms"),
            num(data["bare_hop_s"]["median"], "ms"),
            num(data["ratio"], "x"),
            verdict(data["ratio"], data["target_ratio"]),
            num(data["engine_overhead_s"], "ms"),
            num(data["bare_overhead_s"], "ms"),
            str(data["engine_hop_s"]["n"]),
        ]
        for data in item.values()
    ]
    return table(
        [
            "countdown",
            "engine hop",
            "bare retry hop",
            "ratio",
            "target",
            "engine hop - countdown",
            "bare hop - countdown",
            "repeats",
        ],
        rows,
    )


def _scale_rows(phases: list[dict[str, Any]]) -> list[list[str]]:
    def row(label: str, key: str, unit: str = "") -> list[str]:
        cells = [label]
        for phase in phases:
            cells += [num(phase["engine"][key], unit), num(phase["bare"][key], unit)]
        return cells

    need = ["polls needed per second"]
    for phase in phases:
        need += [num(phase["runs"] / phase["interval_s"])] * 2
    ratio = ["engine / bare: executions, busy slots, worker CPU"]
    for phase in phases:
        ratio += [
            " / ".join(
                num(phase["ratios"][key], "x")
                for key in ("executions_per_s", "busy_slots", "worker_cpu_share")
            ),
            "",
        ]
    return [
        need,
        row("executions per second reached", "executions_per_s"),
        row("poll lateness p50 (start - ETA)", "lateness_p50_s", "ms"),
        row("poll lateness p99", "lateness_p99_s", "ms"),
        row("busy pool slots (of 2)", "busy_slots"),
        row("worker CPU, share of 2 cores", "worker_cpu_share", "%"),
        row("worker main process CPU, share of 1 core", "worker_main_cpu_share", "%"),
        row("PostgreSQL + Redis CPU, share of 2 cores", "db_and_redis_cpu_share", "%"),
        row("whole machine CPU (all users)", "machine_cpu_share", "%"),
        row("worker memory PSS, MiB (main + children)", "worker_pss_mib"),
        row("of which main process, MiB", "worker_main_pss_mib"),
        ratio,
    ]


def scale(report: dict[str, Any]) -> str:
    item = report.get("scale")
    if not item:
        return "_not measured (see errors)_"
    half, full, sat = item["at_half_capacity"], item["at_scale"], item["saturation"]
    header = ["one poll every " + num(full["interval_s"]) + " s"]
    for phase in (half, full):
        header += [f"engine, {phase['runs']} runs", f"bare, {phase['runs']} loops"]
    text = table(header, _scale_rows([half, full]))
    text += (
        f"\n\nMedians over {item['subwindows']} sub-windows of a {item['half_window_s']:g} s "
        f"(half capacity) and a {item['window_s']:g} s ({full['runs']} runs) window; "
        f"launching the {full['runs']} runs took {full['engine'].get('launch_seconds', 0):.0f} s. "
        f"The half-capacity count is half of what the engine's saturated rate can poll every "
        f"{full['interval_s']:g} s. Worker memory idle: {num(item['worker_pss_idle_mib'])} MiB "
        f"PSS; a pool child grows to about a quarter GiB once it has run retries, bare or "
        "engine alike (Celery's, not the engine's). A blocking wait would hold "
        f"{item['blocking_wait_slots_needed']} pool slots for "
        f"{full['runs']} runs in flight; the engine's busy slots are in the table."
    )
    text += "\n\n" + table(
        ["highest sustained rate (both slots always busy)", "per second", "engine ratio", "target"],
        [
            [
                f"engine polls ({sat['runs']} runs, 0.01 s interval)",
                num(sat["engine_polls_per_s"]),
                "",
                "",
            ],
            [
                f"bare retry hops ({sat['runs']} loops, 0.01 s countdown)",
                num(sat["bare_retries_per_s"]),
                num(sat["ratio_to_bare_retry"], "x"),
                verdict(sat["ratio_to_bare_retry"], sat["target_ratio"], at_most=False),
            ],
            [
                "bare no-op tasks from a full queue",
                num(sat["bare_noops_per_s"]),
                num(sat["ratio_to_bare_noop"], "x"),
                "",
            ],
        ],
    )
    return text


def cancel(report: dict[str, Any]) -> str:
    item = report.get("cancel") or {}
    rows = []
    for database, data in item.items():
        idle, busy = data["between_polls"], data["mid_poll"]
        rows.append(
            [
                database,
                "between polls",
                num(idle["to_terminal_row_s"]["p50"], "ms"),
                num(idle["to_terminal_row_s"]["p99"], "ms"),
                "no process runs the step",
                "",
                num(idle["baseline_row_read_s"]["p50"], "ms"),
                str(idle["samples"]),
            ]
        )
        rows.append(
            [
                database,
                f"mid-poll (status call blocks {busy['poll_delay_s']:g} s)",
                num(busy["to_terminal_row_s"]["p50"], "ms"),
                num(busy["to_terminal_row_s"]["p99"], "ms"),
                num(busy["to_process_gone_s"]["p50"], "ms"),
                num(busy["to_process_gone_s"]["p99"], "ms"),
                "",
                str(busy["samples"]),
            ]
        )
    if not rows:
        return "_not measured (see errors)_"
    return table(
        [
            "database",
            "step state",
            "to terminal row p50",
            "p99",
            "to process gone p50",
            "p99",
            "baseline: one row read p50",
            "samples",
        ],
        rows,
    ) + (
        "\n\n`cancel()` is synchronous: it returns the terminal record, so the row is terminal "
        "when it returns. The process figure is the pool process that ran the step (its pid "
        "from `steps.worker_pid`) being killed by the revoke (`terminate=True`, SIGKILL). "
        "p99 over a few dozen samples is close to the maximum."
    )


def sweep(report: dict[str, Any]) -> str:
    item = report.get("sweep")
    if not item:
        return "_not measured (see errors)_"
    base = item[0]["median_seconds"]
    rows = [
        [
            f"{row['terminal']:,}",
            f"{row['live']:,}",
            num(row["median_seconds"], "ms"),
            num(ratio(row["median_seconds"], base), "x"),
            str(row["statements_per_pass"]),
        ]
        for row in item
    ]
    return (
        table(
            [
                "terminal runs",
                "live runs",
                "pass (median of 5)",
                "ratio to 0 terminal",
                "statements",
            ],
            rows,
        )
        + (
            "\n\n`bench.sweep_cost.measure`: a fresh database per size, rows bulk-inserted, "
            "then `VACUUM ANALYZE` (as autovacuum leaves a live table), then the timed passes."
        )
        + _remeasured(report.get("sweep_remeasured"))
    )


def _remeasured(meta: dict[str, Any] | None) -> str:
    """A sweep measured apart from the rest of the report (``--only sweep``, merged in)."""
    if not meta:
        return ""
    return (
        f" These rows were measured apart, on commit `{meta['commit']}` at {meta['started']} "
        "(`python -m bench --only sweep`, merged into the report)."
    )


def _launch_row(label: str, rate: dict[str, Any], baseline: str, ratio: str) -> list[str]:
    """One row of the launch table: a launch's p50, p99 and rate, beside its baseline."""
    seconds = rate["per_launch_s"]
    return [
        label,
        num(seconds["p50"], "ms"),
        num(seconds["p99"], "ms"),
        num(rate["launches_per_s"]),
        baseline,
        ratio,
    ]


def launch(report: dict[str, Any]) -> str:
    item = report.get("launch") or {}
    py, http = item.get("python"), item.get("http")
    if not py:
        return "_not measured (see errors)_"
    rows = [
        _launch_row(
            "Python API, new run",
            py["new"],
            "bare 1-task chain send: "
            + num(py["baseline_bare_chain_send"]["per_launch_s"]["p50"], "ms"),
            num(py["ratio_new_to_bare_send"], "x"),
        ),
        _launch_row(
            "Python API, same request_id again",
            py["duplicate"],
            "same run returned, nothing written: "
            + str(py["duplicates_returned_same_run_and_wrote_nothing"]),
            "",
        ),
    ]
    crowded = py.get("beside_live")
    if crowded:
        rows.append(
            _launch_row(
                f"Python API, new run, beside {crowded['live_runs']:,} more live runs of its owner",
                crowded["new"],
                "bare 1-task chain send, interleaved: "
                + num(crowded["baseline_bare_chain_send"]["per_launch_s"]["p50"], "ms"),
                num(crowded["ratio_new_to_bare_send"], "x"),
            )
        )
    rows.append(["Python API, 4 threads", "", "", num(py.get("threads_4_launches_per_s")), "", ""])
    if http and "new" in http:
        rows += [
            _launch_row(
                "HTTP POST /runs, new run",
                http["new"],
                "Python API in the same run: "
                + num(http["baseline_python_api"]["per_launch_s"]["p50"], "ms"),
                num(http["ratio_new_to_python_api"], "x"),
            ),
            _launch_row(
                "HTTP, same request_id again",
                http["duplicate"],
                "same run returned, nothing written: "
                + str(http["duplicates_returned_same_run_and_wrote_nothing"]),
                "",
            ),
        ]
    text = table(["launch", "p50", "p99", "per second (1 / p50)", "baseline", "ratio"], rows)
    text += (
        f"\n\n{py['launches']} launches of a {py['steps_per_workflow']}-step workflow, each with "
        "a `request_id`, sent to a queue no worker reads (PostgreSQL)."
    )
    if http and "skipped" in http:
        text += f" HTTP not measured: {http['skipped']}."
    return text


def fanout(report: dict[str, Any]) -> str:
    item = report.get("fanout")
    if not item:
        if "fanout" in (report.get("errors") or {}):
            return "_not measured (see errors)_"
        return "_not measured in this run (`python -m bench --only fanout`)_"
    engine, bare = item["engine_s"], item["bare_s"]
    text = table(
        [
            "engine, parent run terminal",
            "bare Celery group",
            "ratio",
            "engine per branch",
            "bare per task",
            "step executions per branch",
            "engine execution (p50)",
            "repeats (engine / bare)",
        ],
        [
            [
                _seconds(engine["median"]),
                _seconds(bare["median"]),
                num(item["ratio"], "x"),
                num(item["engine_per_branch_s"], "ms"),
                num(item["bare_per_task_s"], "ms"),
                num(item["engine_executions_per_branch"]),
                num(item["engine_execution_busy_s"]["p50"], "ms"),
                f"{engine['n']} / {bare['n']}",
            ]
        ],
    )
    samples = ", ".join(_seconds(value) for value in item["engine_samples_s"])
    bare_samples = ", ".join(_seconds(value) for value in item["bare_samples_s"])
    return text + f"\n\nEvery repeat: engine {samples}; bare {bare_samples}."


def _seconds(value: Any) -> str:
    shown = num(value)
    return shown if shown == "n/a" else f"{shown} s"
