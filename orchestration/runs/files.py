"""Files in an output: a part ``{"file": {name, media_type, sha256, size, base64}}`` is
stored as an artifact of the run's owner by its sha256, and the output keeps its reference
``{"file": {name, media_type, sha256, size}}`` (issue 32).

Any provider may answer files in that shape (the ``a2a`` provider does for a part given
inline); bytes inline would sit in the run's JSON, every read of it and the dashboard, and
escape the owner's stored-bytes budget. A file given by URL is left as it is (never
fetched). An artifact is referenced while a step's output names its hash: the reference
itself, or, for an output stored as an artifact, the ``files`` its row's reference lists
(:func:`named`, which deletion and prune read).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.core.models import Artifact
from orchestration.core.settings import Settings
from orchestration.limits import bounds
from orchestration.runs import artifacts

#: A file's media type when it names none.
OCTETS = "application/octet-stream"


@dataclass(frozen=True)
class Stored:
    """The output with each file's bytes replaced by its reference, and the files' hashes."""

    value: Any
    hashes: frozenset[str]


@dataclass(frozen=True)
class Refused:
    """Why the output's files cannot be stored; ``over`` when a bound refused them."""

    problem: str
    over: bool


def _carries_bytes(value: Any) -> bool:
    """Whether ``value`` is a file part with its bytes (``{"file": {..., "base64"}}``)."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get("file"), dict)
        and "base64" in value["file"]
    )


def _files(value: Any, wanted: Callable[[Any], bool]) -> Iterator[dict[str, Any]]:
    """The ``file`` of every part of ``value`` that is ``wanted``, at any depth, in order."""
    if wanted(value):
        yield value["file"]
    elif isinstance(value, dict):
        for item in value.values():
            yield from _files(item, wanted)
    elif isinstance(value, list):
        for item in value:
            yield from _files(item, wanted)


def _file_parts(value: Any) -> Iterator[dict[str, Any]]:
    """Every file part with bytes in ``value``, at any depth, in order."""
    return _files(value, _carries_bytes)


def _decoded(part: dict[str, Any]) -> bytes | str:
    """The part's bytes, checked against its ``sha256`` and ``size``; or why they are not
    what it claims."""
    name = part.get("name") or "a file"
    try:
        data = base64.b64decode(str(part["base64"]), validate=True)
    except (binascii.Error, ValueError):
        return f"file {name!r}: its base64 is not valid base64"
    digest = hashlib.sha256(data).hexdigest()
    if digest != part.get("sha256"):
        return (
            f"file {name!r}: its {len(data)} bytes hash to sha256:{digest}, not the "
            f"sha256:{part.get('sha256')} it claims; the provider sent a broken file part"
        )
    if part.get("size") is not None and part["size"] != len(data):
        return f"file {name!r}: it is {len(data)} bytes, not the {part['size']} it claims"
    return data


def _reference(part: dict[str, Any], data: bytes) -> dict[str, Any]:
    """What the output keeps of a stored file: everything but its bytes."""
    described = {key: value for key, value in part.items() if key != "base64"}
    return {**described, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _replaced(value: Any, references: Iterator[dict[str, Any]]) -> Any:
    """``value`` with its file parts, in :func:`_file_parts` order, replaced."""
    if _carries_bytes(value):
        return {"file": next(references)}
    if isinstance(value, dict):
        return {key: _replaced(item, references) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, references) for item in value]
    return value


def store(
    session: Session, settings: Settings, *, owner: str, value: Any, now: datetime
) -> Stored | Refused:
    """Store the files ``value`` carries as artifacts of ``owner`` and return it with their
    references; or refuse when a file's bytes do not match its claimed hash or size, or
    when the new files would pass the owner's ``ORCH_MAX_STORED_BYTES_PER_OWNER`` (bytes it
    already stores under the same hash cost nothing). Nothing is stored when refused."""
    parts = list(_file_parts(value))
    if not parts:
        return Stored(value, frozenset())
    files: dict[str, tuple[bytes, str]] = {}
    references = []
    for part in parts:
        data = _decoded(part)
        if isinstance(data, str):
            return Refused(data, over=False)
        reference = _reference(part, data)
        references.append(reference)
        files[reference["sha256"]] = (data, str(part.get("media_type") or OCTETS))
    held = set(
        session.scalars(
            select(Artifact.sha256).where(Artifact.owner == owner, Artifact.sha256.in_(files))
        )
    )
    new = sum(len(data) for sha256, (data, _) in files.items() if sha256 not in held)
    if new:
        count = len(files) - len(held)
        what = f"the output's {count} new file{'s' if count > 1 else ''} hold {new} bytes and "
        refused = artifacts.over_budget(session, settings, owner, new, what)
        if refused is not None:
            return Refused(refused, over=True)
    for sha256, (data, media_type) in files.items():
        artifacts.store(session, settings, owner, sha256, data, media_type, now)
    return Stored(_replaced(value, iter(references)), frozenset(files))


def keep(
    session: Session,
    settings: Settings,
    *,
    owner: str,
    run_pk: str,
    step_index: int,
    value: Any,
    now: datetime,
) -> artifacts.Kept | Refused:
    """A finished step's output as its row keeps it (:func:`artifacts.keep`), its files
    stored first (:func:`store`); or why it cannot be kept. A file is bounded as the whole
    output was before: the output with its bytes must fit ``ORCH_MAX_OUTPUT_BYTES``. When
    the output itself becomes an artifact, its reference lists the files it names, so they
    stay referenced; a refusal after the files were stored undoes their store. Raises
    nothing of its own."""
    if next(_file_parts(value), None) is None:
        kept = artifacts.keep(
            session,
            settings,
            owner=owner,
            run_pk=run_pk,
            step_index=step_index,
            value=value,
            now=now,
        )
        return Refused(kept, over=True) if isinstance(kept, str) else _listing(kept, value)
    too_big = bounds.over(value, settings.max_output_bytes, "the output", "ORCH_MAX_OUTPUT_BYTES")
    if too_big:
        return Refused(too_big, over=True)
    with session.begin_nested() as files_stored:
        stored = store(session, settings, owner=owner, value=value, now=now)
        if isinstance(stored, Refused):
            return stored
        kept = artifacts.keep(
            session,
            settings,
            owner=owner,
            run_pk=run_pk,
            step_index=step_index,
            value=stored.value,
            now=now,
        )
        if isinstance(kept, str):
            files_stored.rollback()
            return Refused(kept, over=True)
    return _listing(kept, stored.value)


def _listing(kept: artifacts.Kept, value: Any) -> artifacts.Kept:
    """``kept``, when it is the reference to ``value`` stored as an artifact, with the
    hashes of the files ``value`` names (a branch join's output names its branches')."""
    if kept.sha256 is None:
        return kept
    named = sorted(set(_references(value)))
    return artifacts.Kept({**kept.value, "files": named}, kept.sha256) if named else kept


def hashes(kept: artifacts.Kept) -> set[str]:
    """Every artifact an output, as its row keeps it, references: itself and its files."""
    return named(kept.value, kept.sha256) | ({kept.sha256} if kept.sha256 else set())


def named(output: Any, output_sha256: str | None) -> set[str]:
    """The file artifacts a step's stored output references: the references in it, or the
    ``files`` its artifact reference lists."""
    if output_sha256 is not None:
        listed_files = output.get("files") if isinstance(output, dict) else None
        return {str(sha256) for sha256 in listed_files or ()}
    return set(_references(output))


def _is_reference(value: Any) -> bool:
    """Whether ``value`` is a stored file's reference (``{"file": {..., "sha256"}}``)."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get("file"), dict)
        and isinstance(value["file"].get("sha256"), str)
        and "url" not in value["file"]
    )


def _references(value: Any) -> Iterator[str]:
    """The hashes of the stored file references in ``value``."""
    return (str(file["sha256"]) for file in _files(value, _is_reference))
