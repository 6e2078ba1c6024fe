"""How the rooms are laid out: no import cycles, no reads of another object's private attributes, short modules.

Checked on the source (``ast``), so a cycle held apart only by a function-local
or ``TYPE_CHECKING`` import counts as a cycle too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("store", "worker", "supervisor")
# a module past this many lines must say at its top why it is long (STYLE: "no module over ~500 lines
# without a reason at its top"; the supervisor aims at ~400, which this test does not enforce)
LONG_MODULE_LINES = 500


def _modules(room: str) -> dict[str, Path]:
    found = {}
    for path in sorted((REPO / room).rglob("*.py")):
        parts = list(path.relative_to(REPO / room).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the same room that ``name`` imports (relative imports, anywhere in the file)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{target}.{alias.name}" if target else alias.name
                deps.add(full if full in modules else target)
    return {d for d in deps if d in modules and d != name}


@pytest.mark.parametrize("room", ROOMS)
def test_no_import_cycles(room):
    modules = _modules(room)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == [], [" -> ".join(c) for c in cycles]


@pytest.mark.parametrize("room", ("worker", "supervisor"))
def test_no_reads_of_another_objects_private_attributes(room):
    offences = []
    for name, path in _modules(room).items():
        tree = ast.parse(path.read_text())
        imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in imported):
                continue  # its own state, or a module's function (``os._exit``)
            if isinstance(owner, ast.Name) and owner.id == "sup" and node.attr == "_close" and name == "service":
                continue  # the Supervisor's own classmethod closing the instance it made
            offences.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert offences == []


@pytest.mark.parametrize("room", ROOMS)
def test_modules_stay_short_or_say_why(room):
    long = []
    for name, path in _modules(room).items():
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > LONG_MODULE_LINES and "lines" not in docstring:
            long.append(f"{path.relative_to(REPO)} ({text.count(chr(10))} lines)")
    assert long == []
