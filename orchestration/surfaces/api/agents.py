"""``/agents``: the agents a workflow step may name (``agent: NAME``), from the operator's
registry (``orchestration agents add``).

An owner sees each agent's name and provider kind, never its URL or its secret's name: the
registry is the operator's grant, and what lies behind a name is the operator's to know
(``orchestration agents show NAME``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from orchestration.core.followups import Done
from orchestration.surfaces.api.auth import ApiOwner, Orch
from orchestration.workflows import agents

router = APIRouter(tags=["agents"])


@router.get("/agents", summary="The agents steps may name")
def list_agents(owner: ApiOwner, orch: Orch) -> list[dict[str, Any]]:
    """Each registered agent's ``name`` and ``provider`` (no URL, no secret)."""
    found = orch.transact(lambda session: Done(agents.listing(session)))
    return [entry.public() for entry in found]
