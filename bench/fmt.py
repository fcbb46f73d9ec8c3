"""Formatting for the report: numbers with units, verdicts against targets, tables."""

from __future__ import annotations

import math
from typing import Any


def num(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if unit == "ms":
        return f"{value * 1000:.{max(digits - 2, 1)}f} ms"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value * 100:.0f} %"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def verdict(ratio: Any, target: float, *, at_most: bool = True) -> str:
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return "n/a"
    met = ratio <= target if at_most else ratio >= target
    sign = "≤" if at_most else "≥"
    return f"{'meets' if met else 'misses'} {sign}{target}x"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: Any, base: Any) -> float:
    if not value or not base:
        return math.nan
    return float(value) / float(base)


def get(data: Any, *keys: Any) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data
