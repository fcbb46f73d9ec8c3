"""Reading the worker's execution trace (see ``bench.bare_app``), and its publish trace:
one line per message a process published while ``publish.on`` exists in the trace folder."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

#: While this file exists in the trace folder, every publish is traced (off by default, so
#: the timed measurements pay one ``stat`` per publish, not a JSON encoding).
PUBLISH_ON = "publish.on"


@dataclass(frozen=True)
class Execution:
    """One task execution in a worker process."""

    name: str
    task_id: str
    first_arg: str
    start: float
    end: float
    #: Epoch seconds the message was due (``None`` for a message without a countdown).
    eta: float | None
    retries: int
    state: str
    pid: int

    @property
    def busy(self) -> float:
        return self.end - self.start

    @property
    def lateness(self) -> float | None:
        """How long after its ETA the execution began."""
        return None if self.eta is None else self.start - self.eta


def _parse(line: str, pid: int) -> Execution | None:
    parts = line.split("\t")
    if len(parts) != 8:
        return None  # a line cut by a SIGKILL
    name, task_id, first, start, end, eta, retries, state = parts
    return Execution(
        name,
        task_id,
        first,
        float(start),
        float(end),
        datetime.fromisoformat(eta).timestamp() if eta else None,
        int(retries),
        state,
        pid,
    )


class Tail:
    """Reads only what the worker appended since the last call (the files only grow)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.rows: list[Execution] = []

    def read(self, since: float = 0.0) -> list[Execution]:
        """Every execution traced so far that started at or after ``since``, by start."""
        fresh: list[Execution] = []
        for path in self.folder.glob("trace-*.tsv"):
            pid = int(path.stem.split("-", 1)[1])
            with path.open() as file:
                file.seek(self.offsets.get(path, 0))
                chunk = file.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete.encode())
            for line in complete.splitlines():
                row = _parse(line, pid)
                if row is not None:
                    fresh.append(row)
        if fresh:
            self.rows.extend(fresh)
            self.rows.sort(key=lambda row: row.start)
        return [row for row in self.rows if row.start >= since]


_TAILS: dict[Path, Tail] = {}


def read(folder: Path, since: float = 0.0) -> list[Execution]:
    """Every traced execution in ``folder`` that started at or after ``since``, by start."""
    if folder not in _TAILS:
        _TAILS[folder] = Tail(folder)
    return _TAILS[folder].read(since)


def busy_slots(rows: list[Execution], begin: float, end: float) -> float:
    """Average number of pool processes executing a task over ``[begin, end)``."""
    total = 0.0
    for row in rows:
        total += max(0.0, min(row.end, end) - max(row.start, begin))
    return total / (end - begin)


def hops(rows: list[Execution], task_id: str) -> list[float]:
    """Intervals between consecutive executions of one (retried) task."""
    starts = [row.start for row in rows if row.task_id == task_id]
    return [later - earlier for earlier, later in itertools.pairwise(starts)]


@dataclass(frozen=True)
class Published:
    """One message as its publisher handed it to kombu: JSON sizes of body and headers."""

    name: str
    task_id: str
    first_arg: str
    body_bytes: int
    header_bytes: int
    retries: int

    @property
    def bytes(self) -> int:
        return self.body_bytes + self.header_bytes

    def line(self) -> str:
        return (
            f"{self.name}\t{self.task_id}\t{self.first_arg}\t{self.body_bytes}\t"
            f"{self.header_bytes}\t{self.retries}\n"
        )


def published(sender: Any, body: Any, headers: Any) -> Published:
    """What a ``before_task_publish`` handler sees, measured (protocol 2: the body is
    ``(args, kwargs, embed)``, the chain of the links after this one in ``embed``)."""
    args = body[0] if isinstance(body, (list, tuple)) and body else ()
    headers = headers or {}
    return Published(
        str(sender or headers.get("task", "")),
        str(headers.get("id", "")),
        str(args[0]) if args else "",
        len(json.dumps(body, default=str)),
        len(json.dumps(headers, default=str)),
        int(headers.get("retries") or 0),
    )


def read_published(folder: Path) -> list[Published]:
    """Every message traced in ``folder`` (``publish-<pid>.tsv``)."""
    rows: list[Published] = []
    for path in folder.glob("publish-*.tsv"):
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 6:
                name, task_id, first, body, head, retries = parts
                rows.append(Published(name, task_id, first, int(body), int(head), int(retries)))
    return rows
