"""The marker convention and the output normalisation, without running anything (fast: these
run in the default suite, unlike the ``docs`` tier beside them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import compare
from tests.docs.blocks import MarkerError, Options, parse, parse_options, problems

ID_A = "fb68f229ab9141898f16031602080180"
ID_B = "0123456789abcdef0123456789abcdef"


def test_options_parse() -> None:
    assert parse_options("run, compare, retry 30, exit 2, set RUN_ID") == Options(
        run=True, compare=True, retry=30, exit=2, set="RUN_ID"
    )
    assert parse_options('background, wait "Running on"').wait == "Running on"
    assert parse_options("skip (needs Docker)").skip == "needs Docker"
    for bad in ("compare", "run, frobnicate", "run, set lower", "run, retry"):
        with pytest.raises(MarkerError):
            parse_options(bad)


def test_a_page_is_read_into_marked_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- doc-test: run, compare -->\n<!-- example:x -->\n```console\n$ echo hi\nhi\n\n"
        "$ true\n```\n<!-- /example:x -->\n\n"
        "*Not run by the docs tests: needs Docker.*\n<!-- doc-test: skip (needs Docker) -->\n"
        "```bash\ndocker compose up\n```\n\n```bash\nls\n```\n\n```yaml\na: 1\n```\n",
        encoding="utf-8",
    )
    compared, skipped, unmarked, data = parse(page)
    assert [(c.text, c.line, c.expected) for c in compared.commands] == [
        ("echo hi", 4, "hi"),
        ("true", 7, ""),
    ]
    assert skipped.note and skipped.options and skipped.options.skip == "needs Docker"
    assert problems([compared, skipped, unmarked, data]) == [
        "page.md:17: a bash block without a doc-test marker"
    ]


def test_normalised_output_ignores_ids_times_numbers_and_wrapping() -> None:
    shown = (
        f"run {ID_A}  completed\n  deadline_at: 2026-11-30T04:41:42+00:00\n│ 6     │ ended 3s ago"
    )
    printed = (
        f"run {ID_B} completed deadline_at:\n2027-01-01T00:00:00.123+00:00 │ 12 │ ended 14s ago"
    )
    assert compare.matches(shown, printed)
    assert not compare.matches(shown, printed.replace("completed", "failed"))
    assert compare.id_pairs(shown, printed) == {ID_A: ID_B}
    assert "+" in compare.diff(shown, printed.replace("completed", "failed"))
