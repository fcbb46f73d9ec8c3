"""Artifacts: an output over ``ORCH_INLINE_OUTPUT_BYTES`` is stored once by its sha256, and
the step row keeps its reference ``{sha256, size, media_type}``.

Rows full of megabytes make every read of a run slow (Temporal warns at 256 KB, Flyte
offloads literals with a hash). The bytes live in the ``artifacts`` table (the default) or,
with ``ORCH_ARTIFACT_DIR``, in a file named by the hash in a folder every worker shares; the
row keyed by ``(owner, sha256)`` is written either way, so an owner reads only what it
stored, even knowing another owner's hash. Every read checks the bytes against the hash.
A string is stored as UTF-8 text, any other JSON value as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from orchestration.core.db import insert_spelled
from orchestration.core.errors import ArtifactCorrupt, ArtifactNotFound, LimitExceeded
from orchestration.core.models import Artifact, Step
from orchestration.core.settings import Settings
from orchestration.limits import admission, bounds

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
#: Bytes one read of a stored artifact returns.
CHUNK = 1 << 20


@dataclass(frozen=True)
class Kept:
    """What a step row stores for an output: the output itself, or the reference to it."""

    value: Any
    #: The artifact's hash when ``value`` is its reference, else ``None``.
    sha256: str | None = None


def ref(sha256: str, size: int, media_type: str) -> dict[str, Any]:
    """The reference a row keeps in place of the output."""
    return {"sha256": sha256, "size": size, "media_type": media_type}


def encode(value: Any) -> tuple[bytes, str]:
    """The bytes an artifact stores for ``value``, and their media type."""
    if isinstance(value, str):
        return value.encode(), TEXT
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(), JSON


def decode(data: bytes, media_type: str) -> Any:
    """The value an artifact's bytes hold."""
    text = data.decode()
    return text if media_type == TEXT else json.loads(text)


def keep(
    session: Session,
    settings: Settings,
    *,
    owner: str,
    run_pk: str,
    step_index: int | None,
    value: Any,
    now: datetime,
    what: str = "the output",
) -> Kept | str:
    """``value`` inline when it fits ``ORCH_INLINE_OUTPUT_BYTES``, else stored as an artifact
    of ``owner`` and its reference; or why it cannot be kept (over ``ORCH_MAX_OUTPUT_BYTES``,
    or past the run's ``ORCH_MAX_RUN_OUTPUT_BYTES`` counting the run's other steps, or past
    the owner's ``ORCH_MAX_STORED_BYTES_PER_OWNER`` counting what it stores already: bytes it
    already stores under the same hash cost nothing)."""
    too_big = bounds.over(value, settings.max_output_bytes, what, "ORCH_MAX_OUTPUT_BYTES")
    if too_big:
        return too_big
    if bounds.json_bytes(value) <= settings.inline_output_bytes:
        return Kept(value)
    data, media_type = encode(value)
    used = run_bytes(session, owner, run_pk, but=step_index)
    if used + len(data) > settings.max_run_output_bytes:
        return (
            f"{what} is {len(data)} bytes and the run's other outputs hold {used}: over the "
            f"limit of {settings.max_run_output_bytes} per run (ORCH_MAX_RUN_OUTPUT_BYTES)"
        )
    sha256 = hashlib.sha256(data).hexdigest()
    held = session.scalar(
        select(Artifact.size).where(Artifact.owner == owner, Artifact.sha256 == sha256)
    )
    if held is None:
        refused = over_budget(
            session, settings, owner, len(data), f"{what} is {len(data)} bytes and "
        )
        if refused is not None:
            return refused
    store(session, settings, owner, sha256, data, media_type, now)
    return Kept(ref(sha256, len(data), media_type), sha256)


def over_budget(
    session: Session, settings: Settings, owner: str, size: int, what: str
) -> str | None:
    """Why ``size`` new bytes would pass ``owner``'s ``ORCH_MAX_STORED_BYTES_PER_OWNER``
    (``what`` opens the sentence), or ``None`` when they fit."""
    try:
        admission.check(session, settings, owner, (admission.STORED_BYTES,), size, what)
    except LimitExceeded as exc:
        return exc.problem
    return None


def touch(session: Session, owner: str, hashes: set[str], now: datetime) -> None:
    """Stamp ``used_at`` of artifacts a new row references again (a rerun's reused outputs),
    so a prune running now keeps them; raise :class:`ArtifactNotFound` for one already gone."""
    if not hashes:
        return
    done = session.execute(
        update(Artifact)
        .where(Artifact.owner == owner, Artifact.sha256.in_(sorted(hashes)))
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    )
    if int(done.rowcount or 0) != len(hashes):  # type: ignore[attr-defined]
        raise ArtifactNotFound("an output the rerun reuses was pruned: rerun from an earlier step")


def run_bytes(session: Session, owner: str, run_pk: str, *, but: int | None = None) -> int:
    """Bytes of the artifacts the run's step outputs reference (except step ``but``'s)."""
    query = (
        select(func.coalesce(func.sum(Artifact.size), 0))
        .select_from(Step)
        .join(Artifact, (Artifact.sha256 == Step.output_sha256) & (Artifact.owner == owner))
        .where(Step.run_id == run_pk)
    )
    if but is not None:
        query = query.where(Step.index != but)
    return int(session.scalar(query) or 0)


def store(
    session: Session,
    settings: Settings,
    owner: str,
    sha256: str,
    data: bytes,
    media_type: str,
    now: datetime,
) -> None:
    """Write the artifact once: a second store of the same bytes only stamps ``used_at``."""
    folder = settings.artifact_dir
    if folder is not None:
        _write_file(Path(folder), sha256, data)
    values = {
        "owner": owner,
        "sha256": sha256,
        "size": len(data),
        "media_type": media_type,
        "content": None if folder is not None else data,
        "created_at": now,
        "used_at": now,
    }
    insert = insert_spelled(session.get_bind().dialect.name, Artifact).values(**values)
    session.execute(
        insert.on_conflict_do_update(index_elements=["owner", "sha256"], set_={"used_at": now})
    )


def _write_file(folder: Path, sha256: str, data: bytes) -> None:
    """The bytes at ``folder/ab/abcd…``, written whole or not at all (rename is atomic)."""
    path = file_path(folder, sha256)
    if path.exists() and path.stat().st_size == len(data):
        os.utime(path)  # written now, as far as a prune is concerned
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def file_path(folder: Path, sha256: str) -> Path:
    """Where ``ORCH_ARTIFACT_DIR`` keeps the bytes of ``sha256``."""
    return folder / sha256[:2] / sha256


@dataclass(frozen=True)
class Meta:
    """An artifact's row without its bytes."""

    owner: str
    sha256: str
    size: int
    media_type: str
    #: The bytes are in ``ORCH_ARTIFACT_DIR`` (else in the row).
    in_file: bool


def meta(session: Session, owner: str, sha256: str) -> Meta:
    """The artifact's row, bytes not read. Raises :class:`ArtifactNotFound` (also for
    another owner's)."""
    found = session.execute(
        select(Artifact.size, Artifact.media_type, Artifact.content.is_(None)).where(
            Artifact.owner == owner, Artifact.sha256 == sha256
        )
    ).first()
    if found is None:
        raise ArtifactNotFound(f"no artifact sha256:{sha256}")
    size, media_type, in_file = found
    return Meta(owner, sha256, int(size), media_type, bool(in_file))


def chunks(session: Session, settings: Settings, row: Meta) -> Iterator[bytes]:
    """The artifact's bytes, :data:`CHUNK` at a time (unverified: see :func:`verify`)."""
    for start in range(0, row.size, CHUNK):
        yield _chunk_at(session, settings, row, start)


def verify(session: Session, settings: Settings, row: Meta) -> None:
    """Raise :class:`ArtifactCorrupt` unless the stored bytes hash to the row's sha256."""
    digest = hashlib.sha256()
    size = 0
    for piece in chunks(session, settings, row):
        digest.update(piece)
        size += len(piece)
    if digest.hexdigest() != row.sha256 or size != row.size:
        raise ArtifactCorrupt(
            f"artifact sha256:{row.sha256} does not match its bytes ({size} bytes hash to "
            f"{digest.hexdigest()}): the store was changed outside the engine"
        )


def load(session: Session, settings: Settings, owner: str, reference: dict[str, Any]) -> Any:
    """The value behind a reference, checked against its hash."""
    row = meta(session, owner, str(reference["sha256"]))
    data = b"".join(chunks(session, settings, row))
    if hashlib.sha256(data).hexdigest() != row.sha256:
        raise ArtifactCorrupt(
            f"artifact sha256:{row.sha256} does not match its bytes: the store was changed "
            "outside the engine"
        )
    return decode(data, row.media_type)


def resolved(session: Session, settings: Settings, owner: str, step: Any) -> Any:
    """A step's output (anything with ``output`` and ``output_sha256``), loaded when it is
    an artifact's reference."""
    if step.output_sha256 is None:
        return step.output
    return load(session, settings, owner, step.output)


@dataclass(frozen=True)
class Output:
    """A step's output as the API serves it: the value itself, or the artifact to stream."""

    value: Any = None
    #: The verified artifact's ``{sha256, size, media_type}`` (``value`` unused).
    artifact: dict[str, Any] | None = None


def step_output(session: Session, settings: Settings, owner: str, step: Step) -> Output:
    """The output of ``step`` (of a run of ``owner``): inline, or its artifact after checking
    the stored bytes against the hash (so nothing unverified is ever streamed)."""
    if step.output_sha256 is None:
        return Output(step.output)
    row = meta(session, owner, step.output_sha256)
    verify(session, settings, row)
    return Output(artifact=ref(row.sha256, row.size, row.media_type))


def stream(transact: Any, settings: Settings, owner: str, sha256: str) -> Iterator[bytes]:
    """The artifact's bytes for a response body, each chunk read in a short transaction of
    its own (``transact`` runs a function of a session and returns its value): a slow
    client holds no connection or lock between chunks."""
    row = transact(lambda session: meta(session, owner, sha256))
    for start in range(0, row.size, CHUNK):
        yield transact(lambda session, at=start: _chunk_at(session, settings, row, at))


def _chunk_at(session: Session, settings: Settings, row: Meta, start: int) -> bytes:
    """:data:`CHUNK` bytes of the artifact from ``start``."""
    if not row.in_file:
        key = (Artifact.owner == row.owner) & (Artifact.sha256 == row.sha256)
        part = session.scalar(select(func.substr(Artifact.content, start + 1, CHUNK)).where(key))
        return bytes(part or b"")
    folder = settings.artifact_dir
    if folder is None:
        raise ArtifactNotFound(
            f"artifact sha256:{row.sha256} is kept in ORCH_ARTIFACT_DIR, which is not set here"
        )
    try:
        with file_path(Path(folder), row.sha256).open("rb") as source:
            source.seek(start)
            return source.read(CHUNK)
    except FileNotFoundError:
        raise ArtifactNotFound(f"artifact sha256:{row.sha256} is missing from {folder}") from None
