"""The PNG figures of ``docs/benchmarks.md`` (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plots(report: dict[str, Any], docs: Path) -> list[str]:
    """The PNG figures; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []
    overhead = report.get("step_overhead") or {}
    hops = report.get("poll_hop") or {}
    if overhead or hops:
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
        labels, values, colors = [], [], []
        for links, data in sorted(overhead.items(), key=lambda kv: int(kv[0])):
            labels += [f"bare\n{links} links", f"engine\n{links} links"]
            values += [
                data["bare_per_link_s"]["median"] * 1000,
                data["engine_per_link_s"]["median"] * 1000,
            ]
            colors += ["tab:gray", "tab:blue"]
        peer = report.get("peer") or {}
        if "per_link_s" in peer:
            labels.append(f"director\n{peer['links']} links*")
            values.append(peer["per_link_without_end_sleep_s"]["median"] * 1000)
            colors.append("tab:orange")
        for entry in (report.get("peers") or {}).values():
            if "per_link_s" in entry:
                labels.append(f"{entry.get('short', entry['peer'])}\n{entry['links']} links")
                values.append(entry["per_link_s"]["median"] * 1000)
                colors.append("tab:purple")
        axes[0].bar(labels, values, color=colors)
        axes[0].tick_params(axis="x", labelsize=8)
        axes[0].set_yscale("log")
        axes[0].set_ylabel("ms per link (median, log scale)")
        axes[0].set_title("Step overhead per chain link (*: without its 0.5 s end sleep)")
        for index, value in enumerate(values):
            axes[0].annotate(f"{value:.1f}", (index, value), ha="center", va="bottom", fontsize=8)
        labels, values, colors = [], [], []
        for data in hops.values():
            countdown = data["countdown_s"] * 1000
            labels += [f"bare\n{countdown:g} ms", f"engine\n{countdown:g} ms"]
            values += [data["bare_hop_s"]["median"] * 1000, data["engine_hop_s"]["median"] * 1000]
            colors += ["tab:gray", "tab:blue"]
        axes[1].bar(labels, values, color=colors)
        axes[1].set_ylabel("ms per hop (median)")
        axes[1].set_title("Poll hop by countdown")
        for index, value in enumerate(values):
            axes[1].annotate(f"{value:.1f}", (index, value), ha="center", va="bottom", fontsize=8)
        fig.suptitle("Engine against bare Celery and its peers, same run (shared 2-core machine)")
        fig.tight_layout()
        path = docs / "benchmarks-overhead.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    scale = report.get("scale")
    if scale:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        half, full, sat = scale["at_half_capacity"], scale["at_scale"], scale["saturation"]
        labels, values, colors = [], [], []
        for phase in (half, full):
            runs = phase["runs"]
            labels += [f"needed\n{runs}", f"engine\n{runs}", f"bare\n{runs}"]
            values += [
                phase["runs"] / phase["interval_s"],
                phase["engine"]["executions_per_s"],
                phase["bare"]["executions_per_s"],
            ]
            colors += ["tab:green", "tab:blue", "tab:gray"]
        labels += ["engine\nsaturated", "bare retry\nsaturated", "bare no-op\nqueue"]
        values += [sat["engine_polls_per_s"], sat["bare_retries_per_s"], sat["bare_noops_per_s"]]
        colors += ["tab:blue", "tab:gray", "tab:gray"]
        axes[0].bar(labels, values, color=colors)
        axes[0].set_ylabel("executions per second")
        axes[0].set_title(f"Polls every {full['interval_s']:g} s on one worker (-c 2)")
        axes[0].tick_params(axis="x", labelsize=8)
        for index, value in enumerate(values):
            axes[0].annotate(f"{value:.0f}", (index, value), ha="center", va="bottom", fontsize=8)
        for phase, marker in ((half, "o"), (full, "s")):
            for key, color in (("engine", "tab:blue"), ("bare", "tab:gray")):
                subs = phase[key]["subwindows"]
                xs = list(range(1, len(subs) + 1))
                axes[1].plot(
                    xs,
                    [sub["lateness_p99_s"] for sub in subs],
                    marker=marker,
                    color=color,
                    linestyle="-" if phase is full else "--",
                    label=f"{key}, {phase['runs']} in flight",
                )
        axes[1].set_yscale("symlog", linthresh=0.01)
        axes[1].set_xticks(range(1, len(full["engine"]["subwindows"]) + 1))
        axes[1].set_xlabel("sub-window")
        axes[1].set_ylabel("poll lateness p99, s (start - ETA)")
        axes[1].set_title("Lateness below and above capacity")
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        path = docs / "benchmarks-scale.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    sweep = report.get("sweep")
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [max(row["terminal"], 1) for row in sweep]
        ax.plot(xs, [row["median_seconds"] * 1000 for row in sweep], "o-", color="tab:blue")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("terminal runs in the table (0 shown at 1)")
        ax.set_ylabel("one sweep pass, ms (median)")
        ax.set_title("Sweep cost with 1,000 live runs")
        for x, row in zip(xs, sweep, strict=True):
            ax.annotate(
                f"{row['median_seconds'] * 1000:.0f} ms, {row['statements_per_pass']} statements",
                (x, row["median_seconds"] * 1000),
                textcoords="offset points",
                xytext=(-20, -14),
                fontsize=8,
            )
        fig.tight_layout()
        path = docs / "benchmarks-sweep.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
