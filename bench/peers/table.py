"""Item 1's peers table in ``docs/benchmarks.md``: each peer's cost per link beside the
engine's and the bare chain's at the same number of links, from the same run, and a line for
each peer that was not measured (the last line of its error; the JSON keeps all of it)."""

from __future__ import annotations

from typing import Any

from bench.fmt import num, ratio, table


def _director_row(peer: dict[str, Any]) -> dict[str, Any]:
    """Director's ``peer`` entry as a row of the peers table (its figure without the fixed
    sleep of its ``end`` task)."""
    versions = peer.get("versions") or {}
    return {
        "name": f"celery-director {versions.get('celery-director', '?')} "
        f"(Celery {versions.get('celery', '?')})",
        "per_link_s": peer["per_link_without_end_sleep_s"],
        "how": "its own worker on the same Redis with the same flags (`-P prefork -c 2`, "
        "`acks_late`, prefetch 1, JSON); a fresh PostgreSQL database; without the fixed "
        f"0.5 s sleep of its `end` task ({num(peer['per_link_s']['median'], 'ms')} per link "
        "with it)",
        "links": peer["links"],
        "interleaved_with_engine": peer.get("interleaved_with_engine"),
    }


def _peer_entries(report: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The measured peers as rows, and a line for each peer that was not measured."""
    measured, missing = [], []
    director = report.get("peer") or {}
    if "per_link_s" in director:
        measured.append(_director_row(director))
    elif director:
        missing.append(f"celery-director: {_last_line(director.get('skipped'))}")
    for entry in (report.get("peers") or {}).values():
        numbers = " ".join(str(number) for number in (entry.get("versions") or {}).values())
        name = f"{entry['peer']} {numbers}".strip() + f", {entry['label']}"
        if "per_link_s" in entry:
            measured.append({**entry, "name": name})
        else:
            missing.append(f"{entry['peer']}, {entry['label']}: {_last_line(entry.get('skipped'))}")
    return measured, missing


def _last_line(text: Any) -> str:
    lines = str(text or "no reason recorded").strip().splitlines()
    return lines[-1] if lines else "no reason recorded"


def render(report: dict[str, Any]) -> str:
    """Item 1's peers: each one's cost per link beside the engine's and the bare chain's at
    the same number of links, measured in the same run."""
    measured, missing = _peer_entries(report)
    if not measured and not missing:
        return ""
    item = report.get("step_overhead") or {}
    rows = []
    for entry in measured:
        same = item.get(str(entry["links"])) or {}
        engine = (same.get("engine_per_link_s") or {}).get("median")
        bare = (same.get("bare_per_link_s") or {}).get("median")
        per_link = entry["per_link_s"]["median"]
        rows.append(
            [
                entry["name"],
                num(per_link, "ms"),
                num(ratio(engine, per_link), "x"),
                num(ratio(per_link, bare), "x"),
                str(entry["per_link_s"]["n"]),
                entry["how"],
            ]
        )
    text = ""
    if rows:
        text = table(
            [
                f"peer, {measured[0]['links']} links",
                "per link",
                "engine / peer",
                "peer / bare",
                "repeats",
                "how it runs",
            ],
            rows,
        )
        interleaved = all(entry.get("interleaved_with_engine") for entry in measured)
        text += (
            "\n\nEach peer from its own virtualenv, on the same no-op work: a chain of as many "
            "links as the engine's, timed from its start (launch, enqueue or call) to its end; "
            "median over the runs. "
            + (
                "Timed in the same rounds as the engine's and the bare chains, each round "
                "starting with a different contestant."
                if interleaved
                else "Timed on their own, not in rounds with the engine's chain."
            )
        )
    if missing:
        text += ("\n\n" if text else "") + "Not measured: " + "; ".join(missing) + "."
    return text
