"""The layout is the architecture (docs/architecture.md), checked on the source:

* no import cycles among ``orchestration`` modules (lazy imports inside functions count);
* the domain (everything but ``runtime``, ``surfaces`` and ``service``) imports neither Celery,
  nor ``tasks``, nor the runtime adapters, nor the surfaces;
* only the runtime adapters and ``tasks`` import Celery;
* only the executor and the surfaces open a transaction (``session_scope``); the scripted
  provider's own store is the one provider that keeps a database of its own;
* the domain's folders depend in one direction (:data:`LAYERS`): a folder imports only from
  the folders before it, and no domain module sits outside a folder;
* every table is declared in ``core/models.py``;
* only the database's own guard writes the journal, and only ``core/status_triggers`` may
  turn that guard off (for loading rows written elsewhere).

About 400 lines a module is a guideline for a reader, not a rule a test enforces: a module
is split by concern, never to fit a count.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestration"
#: Modules that are not the domain.
OUTER = (
    "orchestration.runtime",
    "orchestration.surfaces",
    "orchestration.service",
    "orchestration.registered",
    "orchestration.run_actions",
    "orchestration.owner_suspensions",
)
#: The domain's folders, in the order they may depend on each other: each imports only from
#: the ones before it (docs/architecture.md draws them).
LAYERS = (
    "core",
    "limits",
    "providers",
    "workflows",
    "runs",
    "execution",
    "upkeep",
    "reads",
)
#: Beside the layers: logs and traces, which every layer may use and which use only core.
BESIDE = ("observability",)
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


def _folder(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_the_domain_folders_depend_in_one_direction() -> None:
    against = sorted(
        (name, other)
        for name in MODULES
        if (mine := _folder(name)) in LAYERS
        for other in IMPORTS[name]
        if other.startswith("orchestration.")
        and (theirs := _folder(other)) in LAYERS
        and LAYERS.index(theirs) > LAYERS.index(mine)
    )
    assert against == []


def test_every_domain_module_is_in_a_folder() -> None:
    loose = sorted(
        name
        for name, path in MODULES.items()
        if name.count(".") == 1 and path.name != "__init__.py" and not _inside(name, OUTER)
    )
    assert loose == []
    folders = {name.split(".")[1] for name in MODULES if name.count(".") >= 2}
    assert folders <= {*LAYERS, *BESIDE, "runtime", "surfaces", "migrations"}, folders


def _declares_a_table(path: Path) -> bool:
    return any(
        isinstance(node, ast.ClassDef)
        and any(
            isinstance(item, ast.Assign | ast.AnnAssign)
            and "__tablename__" in ast.unparse(item).split("=")[0]
            for item in node.body
        )
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_every_table_is_in_the_models() -> None:
    declaring = sorted(
        name
        for name, path in MODULES.items()
        if _declares_a_table(path) and name != "orchestration.core.models"
    )
    assert declaring == []


#: A journal row built or inserted by code.
_JOURNAL_WRITE = re.compile(r"(?<!class )RunEvent\(|RunEvent\.__table__\.insert|insert\(RunEvent")


def test_no_code_writes_the_journal_or_turns_its_guard_off() -> None:
    journaling = sorted(
        name
        for name, path in MODULES.items()
        if re.search(
            r"(?<!class )RunEvent\(|RunEvent\.__table__\.insert|insert\(RunEvent", path.read_text()
        )
    )
    assert journaling == []
    suspending = sorted(
        name
        for name, path in MODULES.items()
        if "suspended(" in path.read_text() and name != "orchestration.core.status_triggers"
    )
    assert suspending == []
