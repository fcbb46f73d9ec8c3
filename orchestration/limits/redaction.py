"""Finding a secret in what a service echoed, in the encodings services commonly use.

Best effort, by design: the binding of a secret to its hosts is the guarantee, this only
keeps an echo out of rows, logs and screens. A secret is found

- as sent, and in each character's escaped forms, mixed freely: JSON (``\\u00XX`` in either
  case, ``\\/`` and the other short escapes), HTML entities (``&amp;``, ``&#38;``, ``&#x26;``,
  with leading zeros, for every character and by name for ``& < > " '``) and URL
  percent-encoding (``%2F`` in either case, ``+`` for a space);
- in base64, standard or URL-safe, at each of the three alignments it can have inside a
  longer base64 text: the characters that hold only the secret's bits are matched, and the
  one on each side that holds some of them is masked with them. Secrets shorter than
  :data:`MIN_BASE64_BYTES` are not looked for in base64 (they would match by chance).

Not found: other encodings (double escaping, base64 of an escaped form, base64 with line
breaks inside the secret, compression, any cipher).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

#: Shortest secret looked for in base64 (shorter ones would match ordinary text).
MIN_BASE64_BYTES = 8
_HTML_NAMES = {"&": ("amp",), "<": ("lt",), ">": ("gt",), '"': ("quot",), "'": ("apos",)}
_JSON_SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f"}
_JSON_SHORT |= {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Characters that start an escaped form: a text without any holds only plain forms.
_ESCAPES = ("&", "\\", "%", "+")
_BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
_URL_SAFE = str.maketrans("-_", "+/")


def _hex(number: int, width: int = 0) -> str:
    """``number`` in hex as a pattern, in either case: exactly ``width`` digits, or (0) any
    number of leading zeros."""
    digits = f"{number:0{width}x}" if width else f"{number:x}"
    pattern = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in digits)
    return pattern if width else "0*" + pattern


def _char(char: str) -> str:
    """A pattern for ``char`` as it is or in any of its escaped forms."""
    code = ord(char)
    forms = [re.escape(char), f"&#0*{code};", f"&#[xX]{_hex(code)};"]
    forms += [f"&{name};" for name in _HTML_NAMES.get(char, ())]
    if char in _JSON_SHORT:
        forms.append(re.escape(_JSON_SHORT[char]))
    units = [code]
    if code >= 0x10000:  # a UTF-16 surrogate pair
        units = [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + (code & 0x3FF)]
    forms.append("".join(r"\\u" + _hex(unit, 4) for unit in units))
    forms.append("".join("%" + _hex(byte, 2) for byte in char.encode()))
    if char == " ":
        forms.append(r"\+")
    return "(?:" + "|".join(forms) + ")"


def _cores(secret: bytes) -> list[tuple[str, int, int]]:
    """The base64 characters that hold only ``secret``'s bits, at each alignment (standard
    alphabet), with how many partial characters precede and follow them."""
    found = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret + b"\0\0").decode()
        first = -(-8 * shift // 6)
        last = (8 * (shift + len(secret))) // 6
        lead = 1 if (8 * shift) % 6 else 0
        trail = 1 if (8 * (shift + len(secret))) % 6 else 0
        found.append((encoded[first:last], lead, trail))
    return found


@dataclass(frozen=True)
class Masks:
    """How the secrets are found in a text: plain forms, escaped forms, base64 cores."""

    plain: tuple[str, ...]
    escaped: re.Pattern[str] | None
    base64: tuple[tuple[str, int, int], ...]

    def apply(self, text: str, mask: str) -> str:
        """``text`` with every form of every secret replaced by ``mask``."""
        for form in self.plain:
            text = text.replace(form, mask)
        if self.escaped is not None and any(char in text for char in _ESCAPES):
            text = self.escaped.sub(mask, text)
        if self.base64:
            text = self._base64(text, mask)
        return text

    def _base64(self, text: str, mask: str) -> str:
        canonical = text.translate(_URL_SAFE) if ("-" in text or "_" in text) else text
        spans: list[tuple[int, int]] = []
        for core, lead, trail in self.base64:
            start = canonical.find(core)
            while start != -1:
                begin, end = start, start + len(core)
                if lead and begin > 0 and text[begin - 1] in _BASE64:
                    begin -= 1
                if trail and end < len(text) and text[end] in _BASE64:
                    end += 1
                spans.append((begin, end))
                start = canonical.find(core, start + 1)
        if not spans:
            return text
        pieces, last = [], 0
        for begin, end in sorted(spans):
            if end <= last:
                continue
            pieces += [text[last : max(begin, last)], mask]
            last = end
        return "".join([*pieces, text[last:]])


@lru_cache(maxsize=16)
def masks(values: frozenset[str]) -> Masks:
    """The masks of ``values`` (the secrets that are set), longest first so that a secret
    that contains another is masked whole."""
    ordered = sorted(values, key=len, reverse=True)
    escaped = "|".join("".join(map(_char, value)) for value in ordered)
    cores = [
        core
        for value in ordered
        if len(value.encode()) >= MIN_BASE64_BYTES
        for core in _cores(value.encode())
    ]
    return Masks(
        plain=tuple(ordered),
        escaped=re.compile(escaped) if escaped else None,
        base64=tuple(sorted(cores, key=lambda core: len(core[0]), reverse=True)),
    )


def of(values: Iterable[str]) -> Masks:
    """:func:`masks` of the non-empty ``values``."""
    return masks(frozenset(value for value in values if value))
