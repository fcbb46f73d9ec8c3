"""Requests built within one byte budget: what a worker sends is bounded before it is built.

A step's ``with:`` templates are a tenant's, and so are the values filled into them (the
rendered task, a human's answer): a body that names ``{task}`` 30,000 times around a 240 KB
task would be 7 GB once built. So every piece of a request (its URL, each header, each
piece of its JSON body) is charged to one :class:`RequestBudget` of
``ORCH_MAX_REQUEST_BYTES`` before it is made, and the first piece that does not fit raises
:class:`~orchestration.core.errors.RequestOverLimit` (the step fails ``over_limit``). A value
named many times is encoded once and referenced, so the bytes a worker builds for one
request are at most the budget, plus the encoded values, each bounded by its own setting.

A template is plain JSON in which a string that is exactly ``{name}`` becomes the value
itself (any JSON) and a ``{name}`` inside a longer string becomes the value's text; inserted
text is never scanned again. Launch checks count the placeholders (at most
:data:`MAX_PLACEHOLDERS` in one step's options) and bound the nesting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from orchestration.core.errors import RequestOverLimit, ValidationError
from orchestration.limits.bounds import MAX_DEPTH

PLACEHOLDER = re.compile(r"\{(\w+)\}")
#: Most placeholders one step's provider options may hold, all its templates together.
MAX_PLACEHOLDERS = 64
#: Largest piece of a body handed to the transport at once.
CHUNK_BYTES = 65536


class RequestBudget:
    """Bytes one request may still take; ``charge`` raises once they are spent."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.left = limit
        self.what = what

    @property
    def used(self) -> int:
        return self.limit - self.left

    def charge(self, size: int) -> None:
        """Take ``size`` bytes, before the piece they are for is built or kept."""
        self.left -= size
        if self.left < 0:
            raise RequestOverLimit(
                f"{self.what}: the request would be over {self.limit} bytes, URL, headers and "
                "body together (ORCH_MAX_REQUEST_BYTES); name large values such as {task} "
                "fewer times, or send less"
            )


@dataclass(frozen=True)
class Verbatim:
    """A part of a body template sent as it is: no placeholder in it is filled."""

    value: Any


def _dumps(value: Any) -> bytes:
    """``value`` as httpx sends JSON: compact, UTF-8, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _inside(text: str) -> bytes:
    """``text`` escaped for the inside of a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


def _placeholders(text: str, names: Collection[str]) -> list[re.Match[str]]:
    return [match for match in PLACEHOLDER.finditer(text) if match.group(1) in names]


def fill_url(template: str, values: Mapping[str, Any], budget: RequestBudget) -> str:
    """``template`` with each ``{name}`` of ``values`` replaced by the value's text,
    percent-encoded (``safe=""``), each piece charged before it is kept."""
    encoded: dict[str, str] = {}
    pieces: list[str] = []
    last = 0
    for match in _placeholders(template, values):
        name = match.group(1)
        if name not in encoded:
            encoded[name] = quote(str(values[name]), safe="")
        for piece in (template[last : match.start()], encoded[name]):
            budget.charge(len(piece.encode()))
            pieces.append(piece)
        last = match.end()
    tail = template[last:]
    budget.charge(len(tail.encode()))
    pieces.append(tail)
    return "".join(pieces)


class _Body:
    """One JSON body being written: each piece charged, each value encoded once."""

    def __init__(self, values: Mapping[str, Any], budget: RequestBudget) -> None:
        self._values = values
        self._budget = budget
        self._whole: dict[str, bytes] = {}
        self._text: dict[str, bytes] = {}
        self.pieces: list[bytes] = []

    def _put(self, piece: bytes) -> None:
        self._budget.charge(len(piece))
        self.pieces.append(piece)

    def _cached(self, cache: dict[str, bytes], name: str, encode: Callable[[Any], bytes]) -> bytes:
        if name not in cache:
            cache[name] = encode(self._values[name])
        return cache[name]

    def write(self, node: Any) -> None:
        if isinstance(node, Verbatim):
            self._put(_dumps(node.value))
        elif isinstance(node, str):
            self._string(node)
        elif isinstance(node, Mapping):
            self._put(b"{")
            for index, (key, item) in enumerate(node.items()):
                key_text = key if isinstance(key, str) else json.dumps(key)
                self._put((b"," if index else b"") + _dumps(key_text) + b":")
                self.write(item)
            self._put(b"}")
        elif isinstance(node, list):
            self._put(b"[")
            for index, item in enumerate(node):
                if index:
                    self._put(b",")
                self.write(item)
            self._put(b"]")
        else:
            self._put(_dumps(node))

    def _string(self, text: str) -> None:
        found = _placeholders(text, self._values)
        if not found:
            self._put(_dumps(text))
            return
        if len(found) == 1 and found[0].span() == (0, len(text)):
            self._put(self._cached(self._whole, found[0].group(1), _dumps))
            return
        self._put(b'"')
        last = 0
        for match in found:
            self._put(_inside(text[last : match.start()]))
            self._put(self._cached(self._text, match.group(1), _embedded))
            last = match.end()
        self._put(_inside(text[last:]) + b'"')


def _embedded(value: Any) -> bytes:
    """A value's text inside a longer string: a string as it is, anything else as JSON."""
    return _inside(value if isinstance(value, str) else json.dumps(value))


@dataclass(frozen=True)
class Body:
    """A rendered JSON body as the pieces it was charged in. It is never joined whole: the
    transport sends it chunk by chunk (a value named many times is one object, referenced),
    and it can be sent again (a retry within the call)."""

    pieces: tuple[bytes, ...]
    size: int

    def __iter__(self) -> Iterator[bytes]:
        waiting: list[bytes] = []
        held = 0
        for piece in self.pieces:
            if len(piece) >= CHUNK_BYTES:
                if waiting:
                    yield b"".join(waiting)
                    waiting, held = [], 0
                for start in range(0, len(piece), CHUNK_BYTES):
                    yield piece[start : start + CHUNK_BYTES]
                continue
            waiting.append(piece)
            held += len(piece)
            if held >= CHUNK_BYTES:
                yield b"".join(waiting)
                waiting, held = [], 0
        if waiting:
            yield b"".join(waiting)

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)


def fill_body(template: Any, values: Mapping[str, Any], budget: RequestBudget) -> Body:
    """The JSON body ``template`` fills to (see the module docstring), within ``budget``."""
    body = _Body(values, budget)
    body.write(template)
    return Body(tuple(body.pieces), sum(map(len, body.pieces)))


def count(template: Any, names: Collection[str], field: str, depth: int = 0) -> int:
    """How many placeholders of ``names`` ``template`` holds (keys are never filled);
    ``ValidationError`` on ``field`` when it is nested deeper than templates may be."""
    if depth > MAX_DEPTH:
        raise ValidationError(field, f"is nested deeper than {MAX_DEPTH} levels")
    if isinstance(template, str):
        return len(_placeholders(template, names))
    if isinstance(template, Mapping):
        return sum(count(item, names, field, depth + 1) for item in template.values())
    if isinstance(template, list):
        return sum(count(item, names, field, depth + 1) for item in template)
    return 0
