"""What a scripted step's options may say (``ScriptedProvider.validate``): checked at launch,
so a run never starts with a script the simulator cannot play."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestration.core.errors import ValidationError
from orchestration.providers.base import ProviderStatus

#: Longest duration a script may state (about 115 days): beyond it ``timedelta`` overflows.
MAX_SECONDS = 10_000_000

#: Every option a scripted step may set, and what it does: ``docs/providers.md`` shows this
#: table (``tests/e2e/test_docs.py`` renders it from here and compares).
OPTIONS: dict[str, str] = {
    "states": (
        "the turn's script: `[status, seconds]` pairs played from the turn's start, the last "
        'held forever (its seconds may be left out), e.g. `[["running", 0.5], ["idle"]]`; '
        'default `[["running", 1], ["completed"]]`'
    ),
    "output": "the answer of a finished (`completed` or `idle`) turn; default: the rendered task",
    "error": "the error text of a `failed` turn; default `scripted failure`",
    "prompt": "what an `input_required` turn asks; default `input required`",
    "reset_after": (
        "seconds until a `rate_limited` turn may resume; default: that state's duration in `states`"
    ),
    "cancel_delay": "seconds a cancel takes to land; default 0",
    "resume_states": (
        'the script of a turn that resumes a human park (after `answer`); default `[["completed"]]`'
    ),
    "resume_output": "the answer of a resumed turn; default: the human's answer",
    "poll_delay": (
        "seconds each status call blocks, to rehearse a slow runtime; one longer than "
        "`ORCH_PROVIDER_TIMEOUT` is reported as an outage after that timeout"
    ),
    "checkpoint_fails": (
        "`true` makes the checkpoint capture fail, to rehearse effects that exhaust their attempts"
    ),
    "attempt_states": (
        'a script per attempt of the step, e.g. `[[["failed"]], [["failed"]]]` fails the '
        "first two; later attempts play `states` (to rehearse `retry`)"
    ),
    "evidence": (
        "what the simulated agent says of itself, `{name, version}` (recorded as the step's "
        "evidence, compared by `pin`); default: nothing"
    ),
}
#: The option names.
KNOWN = frozenset(OPTIONS)


def check(options: Mapping[str, Any]) -> None:
    """Refuse an option the simulator does not know, or a value it cannot play."""
    unknown = set(options) - KNOWN
    if unknown:
        raise ValidationError(
            sorted(unknown)[0], f"is not a scripted option; known: {sorted(KNOWN)}"
        )
    for name in ("states", "resume_states"):
        if name in options:
            _check_states(options[name], name)
    for name in ("reset_after", "cancel_delay", "poll_delay"):
        _number(options, name)
    if "error" in options and not isinstance(options["error"], str):
        raise ValidationError("error", "must be a string")
    if "checkpoint_fails" in options and not isinstance(options["checkpoint_fails"], bool):
        raise ValidationError("checkpoint_fails", "must be true or false")
    said = options.get("evidence")
    if said is not None and (
        not isinstance(said, Mapping)
        or set(said) - {"name", "version"}
        or not all(isinstance(value, str) for value in said.values())
    ):
        raise ValidationError("evidence", "must be {name: text, version: text}")
    scripts = options.get("attempt_states", [])
    if not isinstance(scripts, list):
        raise ValidationError("attempt_states", "must be a list of scripts, one per attempt")
    for number, script in enumerate(scripts):
        _check_states(script, f"attempt_states[{number}]")


def _number(options: Mapping[str, Any], name: str, field: str | None = None) -> None:
    value = options.get(name)
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_SECONDS
    ):
        raise ValidationError(field or name, f"must be a number of seconds from 0 to {MAX_SECONDS}")


def _check_states(states: Any, name: str) -> None:
    if not isinstance(states, list) or not states:
        raise ValidationError(name, "must be a non-empty list of [status, seconds] pairs")
    words = {status.value for status in ProviderStatus}
    for index, entry in enumerate(states):
        where = f"{name}[{index}]"
        last = index == len(states) - 1
        if not isinstance(entry, list) or not 1 <= len(entry) <= 2:
            raise ValidationError(where, "must be [status, seconds] (seconds optional on the last)")
        if not isinstance(entry[0], str) or entry[0] not in words:
            raise ValidationError(where, f"unknown status {entry[0]!r}; one of {sorted(words)}")
        if len(entry) == 1 and not last:
            raise ValidationError(where, "needs seconds: only the last state is held forever")
        if len(entry) == 2:
            _number({"seconds": entry[1]}, "seconds", where)
