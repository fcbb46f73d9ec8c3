"""The operator's agent registry: agents a step names (``agent: NAME``) instead of a provider
and a URL.

An entry holds the provider kind, the URL, the secret its calls carry and default ``with:``
options. A step that names it may add options but never the URL or the secret: those keys
are the entry's (:data:`RESERVED`). Registering checks the URL against ``ORCH_PROVIDER_HOSTS``
and the secret against ``ORCH_PROVIDER_SECRETS``, so the entry is the grant: with
``ORCH_ALLOW_RAW_URLS`` off (the default) a tenant reaches only the hosts of registered
agents. A launch keeps the entries its steps name in ``runs.agents``; the run calls what it
was launched with, whatever the registry says later (:func:`applied`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from orchestration import providers
from orchestration.core.egress import Resolver, system_resolver
from orchestration.core.errors import ValidationError
from orchestration.core.models import Agent
from orchestration.core.settings import Settings
from orchestration.limits import secrets
from orchestration.providers.exchange import check_egress
from orchestration.providers.http import check_url
from orchestration.workflows.steps import StepSpec

#: The providers an agent may be reached through.
KINDS = ("a2a", "mcp", "langgraph", "http")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
#: The http provider's request specs, whose ``url`` the entry's URL prefixes.
_ENDPOINTS = ("start", "status", "cancel", "resume", "version")
#: The ``with:`` keys that carry an agent's URL or secret: the entry's, never a step's.
RESERVED: dict[str, tuple[str, ...]] = {
    "a2a": ("url", "headers"),
    "mcp": ("url", "headers"),
    "langgraph": ("url", "api_key_env"),
    "http": (*_ENDPOINTS, "headers"),
}


@dataclass(frozen=True)
class Entry:
    """One registered agent, as a launch keeps it."""

    name: str
    provider: str
    url: str
    secret: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    pin: bool = False

    def snapshot(self) -> dict[str, Any]:
        """What ``runs.agents`` keeps of it."""
        return {**asdict(self), "options": dict(self.options)}

    def public(self) -> dict[str, Any]:
        """What an owner may see: the name and the provider kind (no URL, no secret)."""
        return {"name": self.name, "provider": self.provider}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            name=str(data["name"]),
            provider=str(data["provider"]),
            url=str(data["url"]),
            secret=data.get("secret"),
            options=dict(data.get("options") or {}),
            pin=bool(data.get("pin")),
        )


def _entry(row: Agent) -> Entry:
    return Entry(row.name, row.provider, row.url, row.secret, dict(row.options or {}), row.pin)


def check_step_options(entry: Entry, given: Mapping[str, Any], field: str) -> None:
    """A step's ``with:`` may add options, never the agent's URL or secret."""
    for key in RESERVED.get(entry.provider, ("url",)):
        if key in given:
            raise ValidationError(
                f"{field}.{key}",
                f"is agent {entry.name!r}'s to set: the registry supplies its URL and secret",
            )


def options(entry: Entry, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options a step naming ``entry`` calls with: the entry's defaults, the step's
    own over them, then the entry's URL and secret where its provider takes them."""
    merged: dict[str, Any] = {**entry.options, **given}
    header = {"Authorization": {"secret": entry.secret, "prefix": "Bearer "}}
    if entry.provider == "langgraph":
        merged["url"] = entry.url
        if entry.secret:
            merged["api_key_env"] = entry.secret
    elif entry.provider == "http":
        base = entry.url.rstrip("/")
        for name in _ENDPOINTS:
            spec = merged.get(name)
            if isinstance(spec, Mapping):
                path = str(spec.get("url", ""))
                merged[name] = {**spec, "url": base + path if path[:1] in ("", "/") else path}
        if entry.secret:
            merged["headers"] = {**(entry.options.get("headers") or {}), **header}
    else:
        merged["url"] = entry.url
        if entry.secret:
            merged["headers"] = {**(entry.options.get("headers") or {}), **header}
    return merged


def applied(specs: Iterable[StepSpec], kept: Mapping[str, Any] | None) -> tuple[StepSpec, ...]:
    """``specs`` with each ``agent:`` step's provider and options from the entries a launch
    kept (``runs.agents``), pinned when its entry is."""
    made = []
    for spec in specs:
        if spec.agent is not None and kept and spec.agent in kept:
            entry = Entry.of(kept[spec.agent])
            spec = spec.model_copy(
                update={
                    "provider": entry.provider,
                    "options": options(entry, spec.options),
                    "pin": spec.pin or entry.pin,
                }
            )
        made.append(spec)
    return tuple(made)


def named(workflow: Any) -> set[str]:
    """The agent names a workflow's steps (their branches too) say, before validation."""
    found: set[str] = set()
    steps = workflow.get("steps") if isinstance(workflow, Mapping) else None
    todo = list(steps) if isinstance(steps, list) else []
    while todo:
        step = todo.pop()
        if not isinstance(step, Mapping):
            continue
        if isinstance(step.get("agent"), str):
            found.add(step["agent"])
        if isinstance(step.get("step"), Mapping):
            todo.append(step["step"])
        parallel = step.get("parallel")
        if isinstance(parallel, Mapping) and isinstance(parallel.get("steps"), list):
            todo.extend(parallel["steps"])
    return found


def resolved(step: StepSpec, where: str, agents: Mapping[str, Entry]) -> StepSpec:
    """``step`` (and its branches) with an ``agent:`` step's provider its agent's; an agent
    that is not registered is refused, naming the step and the agent."""
    update: dict[str, Any] = {}
    if step.agent is not None:
        entry = agents.get(step.agent)
        if entry is None:
            raise ValidationError(
                f"{where}.agent",
                f"step {step.id!r} names agent {step.agent!r}, which is not registered; the "
                "operator registers agents with `orchestration agents add`",
            )
        if "provider" in step.model_fields_set and step.provider != entry.provider:
            raise ValidationError(
                f"{where}.provider",
                f"agent {entry.name!r} is reached through {entry.provider}; leave provider out",
            )
        update["provider"] = entry.provider
    if step.step is not None:
        update["step"] = resolved(step.step, f"{where}.step", agents)
    if step.parallel is not None:
        inner = [
            resolved(branch, f"{where}.parallel.steps[{index}]", agents)
            for index, branch in enumerate(step.parallel.steps)
        ]
        update["parallel"] = step.parallel.model_copy(update={"steps": inner})
    return step.model_copy(update=update) if update else step


# --- the registry's rows --------------------------------------------------------------------


def load(session: Session, names: Iterable[str]) -> dict[str, Entry]:
    """The registered agents among ``names``."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = session.scalars(select(Agent).where(Agent.name.in_(wanted)))
    return {row.name: _entry(row) for row in rows}


def listing(session: Session) -> list[Entry]:
    """Every registered agent, by name."""
    return [_entry(row) for row in session.scalars(select(Agent).order_by(Agent.name))]


def get(session: Session, name: str) -> Entry:
    """The agent ``name``; a :class:`ValidationError` naming it when there is none."""
    row = session.get(Agent, name)
    if row is None:
        raise ValidationError("agent", f"no agent is registered as {name!r}")
    return _entry(row)


def check(entry: Entry, settings: Settings, resolver: Resolver = system_resolver) -> None:
    """What registering checks: the name, the provider kind, the URL against
    ``ORCH_PROVIDER_HOSTS`` and the secret against ``ORCH_PROVIDER_SECRETS`` for its host."""
    if not NAME.fullmatch(entry.name):
        raise ValidationError(
            "name",
            "must be 1-80 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )
    if entry.provider not in KINDS:
        raise ValidationError("provider", f"must be one of {', '.join(KINDS)}")
    if entry.provider not in providers.names():
        raise ValidationError(
            "provider", f"the {entry.provider} provider is not available in this installation"
        )
    check_url(entry.url, "url")
    check_egress(entry.url, "url", settings, resolver)
    if entry.secret is not None:
        if not entry.secret:
            raise ValidationError("secret", "must name a secret")
        secrets.check_bound(entry.secret, {"url": entry.url}, "secret", settings)
    for key in ("url", "api_key_env") if entry.provider != "http" else ():
        if key in entry.options:
            raise ValidationError(f"option.{key}", "is given by --url and --secret")


def add(
    session: Session,
    settings: Settings,
    entry: Entry,
    now: datetime,
    *,
    resolver: Resolver = system_resolver,
) -> bool:
    """Check and store ``entry`` (replacing the one of its name); whether it is new."""
    check(entry, settings, resolver)
    row = session.get(Agent, entry.name)
    values = {
        "provider": entry.provider,
        "url": entry.url,
        "secret": entry.secret,
        "options": dict(entry.options),
        "pin": entry.pin,
        "updated_at": now,
    }
    if row is None:
        session.add(Agent(name=entry.name, created_at=now, **values))
        return True
    for key, value in values.items():
        setattr(row, key, value)
    return False


def remove(session: Session, name: str) -> bool:
    """Forget the agent ``name``; whether there was one. Runs launched with it keep calling
    what they were launched with."""
    gone = session.scalars(delete(Agent).where(Agent.name == name).returning(Agent.name))
    return gone.first() is not None
