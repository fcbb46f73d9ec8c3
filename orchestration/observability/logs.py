"""Log lines as JSON objects (``ORCH_LOG_FORMAT=json``), each carrying the run, step, attempt
and task it is about, so a log store can select one run's lines across every process."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from orchestration.observability import context

#: What a host process knows that the context does not (Celery's current task).
Extra = Callable[[], Mapping[str, Any]]


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, then the
    context's fields that are known, then ``exc_info`` when there is a traceback."""

    def __init__(self, extra: Extra | None = None) -> None:
        super().__init__()
        self.extra = extra

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.extra is not None:
            line.update(self.extra())
        line.update(context.fields())
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def use_json(logger: logging.Logger, extra: Extra | None = None) -> None:
    """Make every handler of ``logger`` write JSON (Celery's, once it has set them up)."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter(extra))


def configure(log_format: str, level: int = logging.WARNING) -> None:
    """For a process that sets up no logging of its own (the CLI, the API): with ``json``, one
    handler on the root logger, to stderr, at ``level``. With ``text``, nothing changes."""
    if log_format != "json":
        return
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers = [handler]
    root.setLevel(level)
