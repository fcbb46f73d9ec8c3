"""``GET /artifacts/{sha256}``: an artifact of the caller's by its hash, such as a file an
output names (``{"file": {..., "sha256"}}``, :mod:`orchestration.runs.files`).

An artifact is the owner's (its row is keyed by owner and hash): another owner's, even one
whose hash is known, is ``404 not_found``, like a missing one.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse

from orchestration.surfaces.api.auth import ApiOwner, Orch

router = APIRouter(prefix="/artifacts", tags=["artifacts"])


@router.get(
    "/{sha256}",
    summary="An artifact's bytes",
    response_model=None,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def artifact(sha256: str, owner: ApiOwner, orch: Orch) -> Response:
    """The bytes streamed with their media type, ``Content-Length`` and the sha256 as the
    ``ETag`` (checked before the first byte); 500 ``artifact_corrupt`` when the stored bytes
    no longer match the hash."""
    found = orch.artifact(sha256, owner=owner)
    return StreamingResponse(
        orch.artifact_bytes(found["sha256"], owner=owner),
        media_type=found["media_type"],
        headers={
            "Content-Length": str(found["size"]),
            "ETag": f'"{found["sha256"]}"',
            "X-Content-SHA256": found["sha256"],
        },
    )
