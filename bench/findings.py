"""What the numbers say: sentences for ``docs/benchmarks.md`` built from one run's numbers."""

from __future__ import annotations

from typing import Any

from bench.fmt import get, num, ratio


def _loads(prof: dict[str, Any]) -> str:
    """How many selectin loads of ``Run.steps`` each execution phase pays (the step SELECTs
    that disappear when the relationship is lazy)."""
    shipped = get(prof, "statements", "as_is", "200")
    lazy = get(prof, "statements", "steps_lazy_select", "200")
    if not shipped or not lazy:
        return ""
    counts = [
        f"{num(shipped[phase]['step_selects'] - lazy[phase]['step_selects'])} ({phase})"
        for phase in ("start", "poll", "finish")
        if phase in shipped and phase in lazy
    ]
    return "; the stepper loads the run " + ", ".join(counts) + " times per execution"


def steps_loading(report: dict[str, Any]) -> str:
    """How ``Run.steps`` was loaded in the measured engine (``selectin`` or ``select``)."""
    recorded = get(report, "meta", "run_steps_loading")
    if recorded:
        return str(recorded)
    from orchestration.core.models import Run

    return str(Run.__mapper__.relationships["steps"].lazy)


def findings(report: dict[str, Any]) -> str:
    """What the numbers say, in sentences built from this run's numbers."""
    lines: list[str] = []
    eager = steps_loading(report) == "selectin"
    o20, o200 = get(report, "step_overhead", "20"), get(report, "step_overhead", "200")
    prof = report.get("profile") or {}
    spy = get(prof, "worker_py_spy", "share") or {}
    if o20 and o200:
        short, long = o20["engine_per_link_s"]["median"], o200["engine_per_link_s"]["median"]
        grows = long > 1.1 * short
        constant = get(report, "messages", "per_step") is not None
        lines.append(
            (
                "- **A link costs more the longer the run.** "
                if grows
                else "- **A link costs no more in a long run.** "
            )
            + f"Per link: {num(short, 'ms')} in a 20-step run, {num(long, 'ms')} in a 200-step "
            f"run; one step execution (p50) {num(o20['engine_execution_busy_s']['p50'], 'ms')} "
            f"against {num(o200['engine_execution_busy_s']['p50'], 'ms')}, with the same "
            "statement count. "
            + (
                "Every `session.get(Run)` also loads all of the run's steps (`Run.steps` is "
                '`lazy="selectin"`) and decodes their JSON columns and the whole `Run.workflow`'
                f"{_loads(prof)}. "
                if eager
                else "`Run.steps` loads lazily, so what still grows with the run's length is "
                "the whole `Run.workflow` JSON, decoded on every load of the run, and the "
                "chain carried in every step message (below). "
                if grows and not constant
                else ""
            )
            + "py-spy on the worker (200 steps): "
            f"{num(spy.get('Stepper.advance'), '%')} of the time in `Stepper.advance`, "
            f"{num(spy.get('waiting on PostgreSQL'), '%')} waiting on PostgreSQL, "
            f"{num(spy.get('scripted provider'), '%')} in the scripted provider, "
            f"{num(spy.get('JSON decode'), '%')} decoding JSON."
        )
    per = get(prof, "statements", "as_is", "200")
    lazy = get(prof, "statements", "steps_lazy_select", "200")
    if per and lazy and "poll" in per and "poll" in lazy:
        lines.append(
            f"- **A poll is {num(per['poll']['statements'])} statement(s) in "
            + (
                f"{num(per['poll']['transactions'])} transaction(s), "
                if per["poll"]["transactions"]
                else "no transaction (autocommit: one statement is atomic by itself), "
            )
            + f"{num(per['poll']['round_trips'])} round trips** (start "
            f"{num(per['start']['round_trips'])}, finish with effects "
            f"{num(per['finish']['round_trips'])}); a bare retry has none. Each transaction "
            "pays `BEGIN` and `COMMIT`; a pooled connection is pinged (`SELECT 1`) only after "
            "a second idle, and the provider's status read runs in autocommit."
            + (
                f" With `Run.steps` loaded lazily a poll is {num(lazy['poll']['statements'])} "
                f"statements and {num(lazy['poll']['seconds'], 'ms')} in-process instead of "
                f"{num(per['poll']['seconds'], 'ms')}."
                if eager
                else ""
            )
        )
    instant = get(prof, "instant", "all")
    if instant:
        lines.append(
            f"- **An instant step is {num(instant['executions'])} execution(s) of "
            f"{num(instant['transactions'])} transaction(s), {num(instant['statements'])} "
            f"statements** (medians over the {instant['steps']} steps of a "
            f"{prof['instant']['links']}-link run; at most "
            f"{num(instant['max']['transactions'])} transactions, "
            f"{num(instant['max']['statements'])} statements)."
        )
    per_step = get(report, "messages", "per_step")
    sizes = prof.get("message_bytes")
    if per_step and "200" in per_step and "2" in per_step:
        retry = get(per_step, "poll_retry", "retry_bytes", "max")
        lines.append(
            f"- **Bytes per step**: {per_step['200']['bytes_per_step']:,.0f} over a whole "
            f"200-link run, {per_step['2']['bytes_per_step']:,.0f} over a 2-link one "
            f"({num(per_step.get('ratio_200_to_2'), 'x')}); the largest message of the long run "
            f"is {per_step['200']['max_message_bytes']:,} bytes"
            + (f", and a poll's retry {retry:,.0f} bytes." if retry == retry and retry else ".")
        )
    elif sizes:
        lines.append(
            "- **The step message carries the rest of the chain**: "
            f"{sizes.get('200', 0):,} bytes of JSON for the first step of a 200-step run, "
            "and every poll's `self.retry` publishes it again; the bytes over a whole run grow "
            "with the square of its length."
        )
    launch = prof.get("launch_statements")
    if launch and "200" in launch and "3" in launch:
        per_step = launch["200"]["statements"] - launch["3"]["statements"] > 100
        lines.append(
            (
                "- **Launch is one statement per step too many**: "
                if per_step
                else "- **Launch cost by workflow size**: "
            )
            + f"{num(launch['3']['statements'])} statements for 3 steps, "
            f"{num(launch['200']['statements'])} for 200 "
            f"({num(launch['200']['seconds'], 'ms')})"
            + (
                ": `arm()` writes each step's Celery task id with its own `UPDATE`."
                if per_step
                else "."
            )
        )
    redis_side = prof.get("redis")
    if redis_side:
        lines.append(
            "- **Redis is not where the difference is**: "
            f"{num(get(redis_side, 'engine', 'commands_per_execution'))} commands per engine "
            f"execution against {num(get(redis_side, 'bare', 'commands_per_execution'))} per "
            "bare retry (a third of them `-E` events)."
        )
    sweep = report.get("sweep")
    if sweep:
        growth = ratio(sweep[-1]["median_seconds"], sweep[0]["median_seconds"])
        lines.append(
            f"- **The sweep {'stays flat' if growth <= 1.25 else 'grows slowly'}**: "
            f"{num(sweep[-1]['median_seconds'], 'ms')} with {sweep[-1]['terminal']:,} "
            f"terminal runs against {num(sweep[0]['median_seconds'], 'ms')} with none "
            f"({num(growth, 'x')}), {sweep[-1]['statements_per_pass']} statements either way "
            "(the partial index on live runs)."
        )
    return "\n".join(lines) or "_no findings: items failed (see errors)_"
