"""How a command's real output is compared with the output a doc shows.

Run ids, times and figures change with every run, and a terminal wraps long lines where it
must, so both sides are normalised before they are compared:

1. a run id (32 hex characters) becomes ``<id>``;
2. an ISO 8601 time (``2026-11-30T04:41:42+00:00``, with or without fraction) becomes
   ``<time>``;
3. a duration in one unit (``3s``, ``4m``, ``2h``, ``1d``: the CLI's ``12s ago``, ``in 1m``)
   becomes ``<duration>``, whatever its unit, and every other number becomes ``<n>`` (poll
   counts, ``seconds=0.43``);
4. a run of one box-drawing character becomes one (table widths follow their cells), and
   every run of white space, line breaks included, becomes one space.

What is left — the words, the fields, the statuses, the table's columns — must be equal.
"""

from __future__ import annotations

import difflib
import re

RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")
_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\b")
_DURATION = re.compile(r"\b\d+(?:\.\d+)?[smhd]\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_BOX_RUN = re.compile(r"([\u2500-\u257f])\1+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def normalise_lines(text: str) -> list[str]:
    """``text`` with ids, times and numbers replaced, line by line (for showing a diff)."""
    text = _ANSI.sub("", text)
    text = RUN_ID.sub("<id>", text)
    text = _TIME.sub("<time>", text)
    text = _DURATION.sub("<duration>", text)
    text = _NUMBER.sub("<n>", text)
    text = _BOX_RUN.sub(r"\1", text)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def normalise(text: str) -> str:
    """The form in which expected and real output must be equal."""
    return " ".join(" ".join(normalise_lines(text)).split())


def matches(expected: str, actual: str) -> bool:
    return normalise(expected) == normalise(actual)


def id_pairs(expected: str, actual: str) -> dict[str, str]:
    """The run ids the doc shows, each mapped to the id printed in its place."""
    return dict(zip(RUN_ID.findall(expected), RUN_ID.findall(actual), strict=False))


def diff(expected: str, actual: str) -> str:
    """A readable difference of the normalised outputs."""
    return "\n".join(
        difflib.unified_diff(
            normalise_lines(expected),
            normalise_lines(actual),
            "the doc shows",
            "the command printed",
            lineterm="",
        )
    )
