"""Run every page's runnable blocks, exactly as written, from a fresh shell.

The project is built into a wheel once and installed into a new virtualenv; each page then
runs in its own session (:mod:`tests.docs.session`): a new HOME, a new working directory that
holds a copy of the repository's files (the docs say "from the repository's root"), that
virtualenv's ``bin`` first on PATH, and no ``ORCH_`` variable the page does not set itself.
The services are the ones the page names (:mod:`tests.docs.services`). A page stops at its
first failing block, which is reported with its file, line, command and output. A page that
leaves a file in the working directory that ``git status`` would show (a file its commands
wrote into the checkout) fails too.

    .venv/bin/pytest -m docs tests/docs          # or: make docs-test
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs import compare, services
from tests.docs.blocks import Block, Command, parse
from tests.docs.session import Job, Session

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _runnable(page: Path) -> list[Block]:
    return [b for b in parse(page) if b.options and not b.options.skip]


def _copy_repository(target: Path) -> Path:
    """The repository's files as a clone has them: tracked and new files, not ignored ones."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="session")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the project installed from its wheel (no extras: the docs
    install none), dependencies from the package index as pip is configured here."""
    folder = tmp_path_factory.mktemp("wheel")
    source = _copy_repository(folder / "source")
    dist = folder / "dist"
    bin_dir = folder / "venv" / "bin"
    _quietly(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source)
    (wheel,) = dist.glob("*.whl")
    _quietly(sys.executable, "-m", "venv", folder / "venv")
    _quietly(bin_dir / "pip", "install", "-q", wheel)
    return bin_dir


def _quietly(*argv: str | Path) -> None:
    """Run a build step; its chatter is shown only when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        pytest.fail(
            f"{' '.join(map(str, argv))}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        )


class Page:
    """One page's run: its session, the ids learned from compared output, the set names."""

    def __init__(self, page: Path, session: Session) -> None:
        self.page = page
        self.session = session
        self.ids: dict[str, str] = {}
        self.names: dict[str, str] = {}

    def substitute(self, text: str) -> str:
        """The documented substitutions: shown run ids, and ``set`` names."""
        for shown, real in self.ids.items():
            text = text.replace(shown, real)
        for name, value in self.names.items():
            text = re.sub(rf"(?<![$\w{{]){name}\b", value, text)
        return text

    def fail(self, block: Block, command: Command, why: str, output: str, extra: str = "") -> None:
        jobs = "".join(
            f"\n--- background job {self.page.name}:{job.line} ({job.command}), last lines ---\n"
            + "\n".join(job.output().splitlines()[-30:])
            for job in self.session.jobs
        )
        pytest.fail(
            f"{self.page.name}:{command.line}: {why}\n$ {self.substitute(command.text)}\n"
            f"--- output ---\n{output.rstrip()}\n{extra}{jobs}",
            pytrace=False,
        )

    def run(self, block: Block) -> None:
        assert block.options is not None
        if block.options.background:
            self.background(block)
            return
        printed = ""
        for command in block.commands:
            printed += self.command(block, command)
        if block.options.set:
            found = compare.RUN_ID.findall(printed)
            if not found:
                self.fail(block, block.commands[-1], f"set {block.options.set}: no run id", printed)
            self.names[block.options.set] = found[0]
            self.session.variable(block.options.set, found[0])

    def command(self, block: Block, command: Command) -> str:
        options = block.options
        assert options is not None
        deadline = time.monotonic() + options.retry
        while True:
            result = self.session.run(
                self.substitute(command.text),
                timeout=options.timeout,
                python=block.lang == "python",
            )
            same = not options.compare or compare.matches(command.expected or "", result.output)
            if result.status == options.exit and same:
                break
            if time.monotonic() >= deadline:
                if result.timed_out:
                    why = f"timed out after {options.timeout:g}s"
                elif result.status != options.exit:
                    why = f"exit status {result.status}, the doc expects {options.exit}"
                else:
                    why = "the output differs from the doc's"
                shown = command.expected or ""
                extra = "" if same else f"--- diff ---\n{compare.diff(shown, result.output)}\n"
                self.fail(block, command, why, result.output, extra)
            time.sleep(1)
        if options.compare:
            for shown, real in compare.id_pairs(command.expected or "", result.output).items():
                self.ids.setdefault(shown, real)
        return result.output

    def background(self, block: Block) -> None:
        options = block.options
        assert options is not None
        jobs = [self.session.start(self.substitute(c.text), c.line) for c in block.commands]
        deadline = time.monotonic() + (options.timeout if options.wait else 1)
        while time.monotonic() < deadline:
            if options.wait and any(options.wait in job.output() for job in jobs):
                return
            if dead := [job for job in jobs if job.proc.poll() is not None]:
                self._job_failed(block, dead[0])
            time.sleep(0.3)
        if options.wait:
            self.fail(block, block.commands[0], f"no job printed {options.wait!r}", "")

    def _job_failed(self, block: Block, job: Job) -> None:
        command = next(c for c in block.commands if c.line == job.line)
        why = f"background job exited by itself, status {job.proc.returncode}"
        self.fail(block, command, why, job.output()[-4000:])

    def finish(self, blocks: list[Block]) -> None:
        exited = self.session.stop()
        for job in exited:
            block = next(b for b in blocks if any(c.line == job.line for c in b.commands))
            self._job_failed(block, job)


def _untracked(work: Path) -> set[str]:
    """The files of ``work`` that ``git status`` would list (not ignored by ``.gitignore``)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--others", "--exclude-standard"],
        cwd=work,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return set(filter(None, listed.split("\0")))


@pytest.mark.parametrize(
    "page", [p for p in PAGES if _runnable(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_page_runs_as_written(page: Path, venv_bin: Path, tmp_path: Path) -> None:
    blocks = _runnable(page)
    named = "\n".join(block.body for block in blocks)
    services.reset(named)
    work = _copy_repository(tmp_path / "work")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    copied = _untracked(work)
    run = Page(page, Session(tmp_path / "session", venv_bin, work))
    try:
        for block in blocks:
            run.run(block)
        run.finish(blocks)
    finally:
        run.session.stop()
        services.reset(named)
    left = sorted(_untracked(work) - copied)
    assert not left, f"{page.name}: its commands left files in the checkout: {left}"
