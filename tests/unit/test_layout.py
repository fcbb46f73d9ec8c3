"""The layout is the architecture (docs/architecture.md), checked on the source:

* no import cycles among ``orchestration`` modules (lazy imports inside functions count);
* the domain (everything but ``runtime``, ``surfaces`` and ``service``) imports neither Celery,
  nor ``tasks``, nor the runtime adapters, nor the surfaces;
* only the runtime adapters and ``tasks`` import Celery;
* only the executor and the surfaces open a transaction (``session_scope``); the scripted
  provider's own store is the one provider that keeps a database of its own.

About 400 lines a module is a guideline for a reader, not a rule a test enforces: a module
is split by concern, never to fit a count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestration"
#: Modules that are not the domain.
OUTER = ("orchestration.runtime", "orchestration.surfaces", "orchestration.service")
#: Where a transaction may be opened: the executor, the surfaces' reads, the scripted
#: provider's own database.
SESSION_OPENERS = ("orchestration.runtime", "orchestration.surfaces", "orchestration.core.db")
OWN_STORE = "orchestration.providers.scripted"


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


IMPORTS = {name: _imports(path) for name, path in MODULES.items()}


def _inside(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_there_are_no_import_cycles() -> None:
    graph = {
        name: {
            other
            for other in IMPORTS[name]
            if other in MODULES and other != name and not other.startswith(name + ".")
        }
        for name in MODULES
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for other in sorted(graph[node]):
            if state.get(other) == 1:
                cycles.append([*stack[stack.index(other) :], other])
            elif other not in state:
                visit(other)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not _inside(n, OUTER)))
def test_the_domain_imports_no_celery_tasks_runtime_or_surface(name: str) -> None:
    bad = {module for module in IMPORTS[name] if _inside(module, ("celery", "tasks", *OUTER))}
    assert bad == set()


def test_only_the_runtime_imports_celery() -> None:
    users = sorted(n for n in MODULES if any(_inside(m, ("celery",)) for m in IMPORTS[n]))
    assert users and all(_inside(n, ("orchestration.runtime",)) for n in users), users


def test_only_the_executor_and_the_surfaces_open_a_transaction() -> None:
    openers = sorted(
        name
        for name, path in MODULES.items()
        if "session_scope(" in path.read_text() and name != OWN_STORE
    )
    assert all(_inside(name, SESSION_OPENERS) for name in openers), openers
