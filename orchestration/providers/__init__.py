"""Provider registry: one module per provider, looked up by the name a workflow step uses."""

from __future__ import annotations

import threading
from collections.abc import Callable

from orchestration.core.errors import ValidationError
from orchestration.core.settings import Settings
from orchestration.providers.base import Provider

#: name -> factory(settings). Each factory is imported lazily so that a provider's optional
#: dependencies are only needed by the workflows that use it.
_FACTORIES: dict[str, Callable[[Settings], Provider]] = {}


def register(name: str, factory: Callable[[Settings], Provider]) -> None:
    """Make a provider available to workflows under ``name``."""
    _FACTORIES[name] = factory


def _scripted(settings: Settings) -> Provider:
    from orchestration.providers.scripted import ScriptedProvider

    return ScriptedProvider(settings)


register("scripted", _scripted)


def _langgraph(settings: Settings) -> Provider:
    from orchestration.providers.langgraph import LangGraphProvider

    return LangGraphProvider(settings)


def _http(settings: Settings) -> Provider:
    from orchestration.providers.http import HttpProvider

    return HttpProvider(settings)


def _a2a(settings: Settings) -> Provider:
    from orchestration.providers.a2a import A2AProvider

    return A2AProvider(settings)


def _mcp(settings: Settings) -> Provider:
    from orchestration.providers.mcp import MCPProvider

    return MCPProvider(settings)


register("langgraph", _langgraph)
register("http", _http)
register("a2a", _a2a)
register("mcp", _mcp)

_CACHE: dict[tuple[str, int], Provider] = {}
_BUILDING = threading.Lock()


def names() -> list[str]:
    """Registered provider names, sorted."""
    return sorted(_FACTORIES)


def get_provider(name: str, settings: Settings) -> Provider:
    """The provider called ``name``, built once per process and settings object."""
    if name not in _FACTORIES:
        raise ValidationError(
            "provider", f"unknown provider {name!r}; known providers: {', '.join(names())}"
        )
    key = (name, id(settings))
    # Threads of one process (the HTTP API's pool) build each provider once.
    with _BUILDING:
        if key not in _CACHE:
            from orchestration.providers.instruments import Instrumented

            _CACHE[key] = Instrumented(_FACTORIES[name](settings))
        return _CACHE[key]
