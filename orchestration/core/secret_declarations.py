"""``ORCH_PROVIDER_SECRETS`` as the settings load it: which secret names the operator
declared, and the hosts each may be sent to (allow-list entries, see :mod:`egress`, each
optionally after ``https://``, or ``http://`` to allow cleartext to that host).

Kept apart from :mod:`orchestration.limits.secrets`, which reads the settings, so that the settings
can check the declaration without importing what depends on them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from orchestration.core.egress import AllowList

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The prefix of an entry that lets its secret travel in cleartext.
CLEARTEXT = "http://"
_SCHEMES = (CLEARTEXT, "https://")


def split_scheme(entry: str) -> tuple[str | None, str]:
    """An entry's scheme prefix (``http://``, ``https://`` or ``None``) and its host part
    (without a trailing ``/``)."""
    for scheme in _SCHEMES:
        if entry.strip().lower().startswith(scheme):
            return scheme, entry.strip()[len(scheme) :].rstrip("/")
    return None, entry


def decode_declared(value: Any) -> Any:
    """``ORCH_PROVIDER_SECRETS`` given as text (settings built from a process's environment)
    decoded as JSON; other values are left for type validation."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value) if value.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(
            f'is not valid JSON ({exc}); expected {{"NAME": ["host:port", ...]}}'
        ) from None


class Declared(dict[str, list[str]]):
    """``ORCH_PROVIDER_SECRETS`` as loaded: a dict that hashes by content, so the frozen
    settings holding it stay hashable (they key caches, e.g. the Celery client app)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((name, tuple(hosts)) for name, hosts in self.items())))


def declared(value: Mapping[str, list[str]]) -> Declared:
    """A checked ``ORCH_PROVIDER_SECRETS``; ``ValueError`` names what is wrong."""
    check_declared(value)
    return Declared({name: list(hosts) for name, hosts in value.items()})


def check_declared(declared: Mapping[str, list[str]]) -> None:
    """Refuse a bad ``ORCH_PROVIDER_SECRETS`` (``ValueError``, for the settings validator)."""
    for name, hosts in declared.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if name.upper().startswith("ORCH_"):
            raise ValueError(f"{name}: ORCH_ variables are configuration, not secrets")
        if not hosts:
            raise ValueError(f"{name}: list the hosts it may be sent to")
        for host in hosts:
            scheme, rest = split_scheme(host)
            if scheme is not None and "/" in rest:
                raise ValueError(
                    f"{name}: entry {host!r}: after {scheme} write only HOST or HOST:PORT"
                )
        try:
            AllowList.of(split_scheme(host)[1] for host in hosts)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
