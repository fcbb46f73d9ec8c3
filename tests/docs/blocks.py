"""The fenced blocks of a Markdown page and the ``doc-test`` marker that says what to do with each.

The convention (also in ``docs/contributing.md``). An HTML comment line before a fence, with
only blank lines or ``<!-- example:NAME -->`` lines between, marks the block; it does not
render. A command block (``bash``, ``sh``, ``shell``, ``console``, ``python``) must have one.

``<!-- doc-test: run -->``
    Run the block. A ``bash`` block runs as one script; a ``console`` block runs each ``$ ``
    line as a command; a ``python`` block runs as a script (``python -``). Each must exit 0.
``compare`` (``console`` only)
    Compare each command's output (stdout, then stderr) with the lines the doc shows under
    it, after :func:`tests.docs.compare.normalise`.
``exit N``
    The commands must exit with status ``N`` instead of 0.
``retry N``
    Run a failing command (or block) again, once a second, for at most ``N`` seconds. Only
    for commands that are harmless to repeat (reads, idempotent launches).
``timeout N``
    Bound on one command, or on a background block's ``wait`` (seconds, default 180).
``background``
    Start each command line of the block as a job of its own (as if typed in its own
    terminal); every job is stopped when the page ends, and one that exited by itself fails.
``wait "TEXT"`` (with ``background``)
    Go on once a job's output contains ``TEXT``.
``set NAME``
    After the block, ``NAME`` is the first run id (32 hex characters) the block printed: later
    blocks get it as ``$NAME``, and the bare word ``NAME`` in their commands is replaced by it.
``skip (REASON)``
    Not run. The rendered page must say so: the paragraph right above the marker is the
    visible note ``*Not run by the docs tests: REASON.*``

Besides ``set``, one substitution is made: a run id the doc shows in compared output stands for
the id the command really printed, and is replaced by it in later commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_LANGS = frozenset({"bash", "sh", "shell", "console", "python"})
NOTE_PREFIX = "*Not run by the docs tests"

_MARKER = re.compile(r"^\s*<!-- doc-test: (?P<options>.*?) -->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_REGION = re.compile(r"^\s*<!-- /?example:[a-z0-9-]+ -->\s*$")


class MarkerError(ValueError):
    """A marker that cannot be read, or that does not fit its block."""


@dataclass(frozen=True)
class Options:
    """What a ``doc-test`` marker asks for."""

    run: bool = False
    compare: bool = False
    background: bool = False
    skip: str | None = None
    exit: int = 0
    retry: float = 0.0
    timeout: float = 180.0
    wait: str | None = None
    set: str | None = None


@dataclass(frozen=True)
class Command:
    """One command of a block and, for ``console`` blocks, the output the doc shows for it."""

    text: str
    line: int
    expected: str | None = None


@dataclass
class Block:
    """A fenced block: where it is, its language, its body, and its marker (if any)."""

    path: Path
    line: int
    lang: str
    body: str
    options: Options | None = None
    marker_line: int | None = None
    note: bool = False
    commands: list[Command] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def is_command(self) -> bool:
        return self.lang in COMMAND_LANGS or self.lang == ""


def parse_options(text: str) -> Options:
    """The options of one marker, e.g. ``run, compare, retry 30`` or ``skip (needs Docker)``."""
    skip = re.fullmatch(r"skip \((?P<why>[^)]+)\)", text.strip())
    if skip:
        return Options(skip=skip["why"])
    values: dict[str, object] = {}
    try:
        parts = shlex.split(text.replace(",", " , "))
    except ValueError as exc:
        raise MarkerError(f"cannot read marker {text!r}: {exc}") from exc
    words = [p for p in parts if p != ","]
    i = 0
    while i < len(words):
        word = words[i]
        if word in {"run", "compare", "background"}:
            values[word] = True
            i += 1
            continue
        if word not in {"exit", "retry", "timeout", "wait", "set"} or i + 1 >= len(words):
            raise MarkerError(f"unknown or incomplete option {word!r} in marker {text!r}")
        raw = words[i + 1]
        if word == "exit":
            values[word] = int(raw)
        elif word in {"retry", "timeout"}:
            values[word] = float(raw)
        elif word == "set" and not re.fullmatch(r"[A-Z][A-Z0-9_]*", raw):
            raise MarkerError(f"set needs an upper-case NAME, not {raw!r}")
        else:
            values[word] = raw
        i += 2
    options = Options(**values)  # type: ignore[arg-type]
    if not (options.run or options.background):
        raise MarkerError(f"marker {text!r} needs run, background or skip")
    return options


def _console_commands(block: Block) -> list[Command]:
    """``$ `` lines and the output lines under each, up to the next ``$ `` line."""
    commands: list[Command] = []
    text: str | None = None
    start = 0
    output: list[str] = []
    for offset, line in enumerate(block.body.splitlines(), start=1):
        if line.startswith("$ "):
            if text is not None:
                commands.append(Command(text, start, "\n".join(output).strip("\n")))
            text, start, output = line[2:], block.line + offset, []
        elif text is not None:
            output.append(line)
    if text is not None:
        commands.append(Command(text, start, "\n".join(output).strip("\n")))
    return commands


def _script_commands(block: Block) -> list[Command]:
    """A script block is one command; a background block has one job per command line."""
    if not (block.options and block.options.background):
        return [Command(block.body, block.line + 1)]
    return [
        Command(line.strip(), block.line + offset)
        for offset, line in enumerate(block.body.splitlines(), start=1)
        if line.strip() and not line.strip().startswith("#")
    ]


def parse(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order, with its marker and commands."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    pending: tuple[Options, int, bool] | None = None
    paragraph = ""  # the first line of the latest paragraph of prose
    in_paragraph = False
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        fence = _FENCE.match(line)
        if marker:
            try:
                options = parse_options(marker["options"])
            except MarkerError as exc:
                raise MarkerError(f"{path.name}:{i + 1}: {exc}") from exc
            pending = (options, i + 1, paragraph.strip().startswith(NOTE_PREFIX))
        elif fence:
            indent = fence["indent"]
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            body = "\n".join(
                row[len(indent) :] if row.startswith(indent) else row for row in lines[i + 1 : end]
            )
            block = Block(path, i + 1, fence["lang"], body)
            if pending:
                block.options, block.marker_line, block.note = pending
                pending = None
            if block.options and not block.options.skip:
                if block.options.compare and block.lang != "console":
                    raise MarkerError(f"{block.where}: compare needs a console block")
                block.commands = (
                    _console_commands(block) if block.lang == "console" else _script_commands(block)
                )
            blocks.append(block)
            in_paragraph = False
            i = end
        elif not line.strip():
            in_paragraph = False
        elif not _REGION.match(line):
            if pending:
                raise MarkerError(
                    f"{path.name}:{pending[1]}: a marker must be right before a fence"
                )
            if not in_paragraph:
                paragraph, in_paragraph = line, True
        i += 1
    return blocks


def problems(blocks: list[Block]) -> list[str]:
    """Command blocks without a marker, and skipped blocks without their visible note."""
    found = []
    for block in blocks:
        if block.is_command and block.options is None:
            found.append(
                f"{block.where}: a {block.lang or 'plain'} block without a doc-test marker"
            )
        elif block.options and block.options.skip and not block.note:
            found.append(f"{block.where}: skipped without the line '{NOTE_PREFIX}: ….*' above it")
    return found
