"""Which request headers a workflow may send: checked at launch and again at call time.

The egress check and the secret binding look at the URL's host, so a header that changes
where or how the request is read would step around them: ``Host`` routes a bound secret to
another virtual host behind a shared ingress, ``Transfer-Encoding`` beside the client's own
``Content-Length`` makes the framing ambiguous (request smuggling), and ``Connection``,
``TE``, ``Upgrade``, ``Expect`` and ``Proxy-*`` are hop-by-hop, the client's to set. So those
names are refused whatever their case, every name must be an RFC 9110 token, and no value
may hold CR, LF or NUL (a second header or request hidden in a value).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

V = TypeVar("V")

#: RFC 9110 ``token``: one or more ``tchar``.
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Header names (lower case) the transport sets or that change how the request is framed,
#: routed or forwarded; a name starting with ``proxy-`` is refused too.
FORBIDDEN = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "expect"}
)
_BREAKS = ("\r", "\n", "\x00")


def name_problem(name: str) -> str | None:
    """Why ``name`` may not be sent as a header name, or ``None`` when it may."""
    if not TOKEN.fullmatch(name):
        return (
            f"{name!r} is not a header name: a token of letters, digits and "
            "!#$%&'*+-.^_`|~ (RFC 9110)"
        )
    lower = name.lower()
    if lower in FORBIDDEN or lower.startswith("proxy-"):
        return (
            f"{name} is set by the engine's HTTP client, not by a workflow (Host, "
            "Content-Length, Transfer-Encoding, Connection, TE, Upgrade, Expect and Proxy-* "
            "would route or frame the request around the egress and secret checks)"
        )
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` may not be sent as (part of) a header value, or ``None``."""
    if any(char in value for char in _BREAKS):
        return "a header value may not hold CR, LF or NUL characters"
    return None


def first_problem(headers: Mapping[str, str]) -> str | None:
    """The first thing wrong with ``headers`` as sent, or ``None`` (the call-time check)."""
    for name, value in headers.items():
        problem = name_problem(name) or value_problem(value)
        if problem is not None:
            return f"header {name!r}: {problem}"
    return None


def merged(*layers: Mapping[str, V]) -> dict[str, V]:
    """``layers`` merged by name whatever its case, a later layer winning: one header per
    name goes on the wire, with the spelling of the layer that set it."""
    found: dict[str, tuple[str, V]] = {}
    for layer in layers:
        for name, value in layer.items():
            found[name.lower()] = (name, value)
    return dict(found.values())


def size(headers: Iterable[tuple[str, str]]) -> int:
    """Bytes ``headers`` take on the wire (``Name: value`` and CRLF each)."""
    return sum(len(name.encode()) + len(value.encode()) + 4 for name, value in headers)
