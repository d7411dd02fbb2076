"""The package tree is the architecture: the runtime never imports the tools, and no module imports itself back.

Read from the source with ``ast`` (every import, deferred ones included), so a circle or a tool import that
only happens on some code path is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "moss_tts_node"
TOOLS = "moss_tts_node.tools"
ROS = "moss_tts_node.ros"
ENTRY_POINT = "moss_tts_node.__main__"  # `python -m moss_tts_node` is the CLI


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                candidates = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            targets.update(c for c in candidates if c in modules and c != name)
        graph[name] = targets
    return graph


GRAPH = _import_graph()


def test_every_import_is_absolute() -> None:
    relative = [
        f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}"
        for path in PACKAGE_DIR.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert not relative, f"use `from moss_tts_node.x import y`: {relative}"


def test_the_runtime_never_imports_the_tools_or_the_ros_adapter() -> None:
    wrong = sorted(
        f"{source} -> {target}"
        for source, targets in GRAPH.items()
        if not source.startswith((TOOLS, ROS)) and source != ENTRY_POINT
        for target in targets
        if target.startswith((TOOLS, ROS))
    )
    assert not wrong, wrong


def test_no_import_circles() -> None:
    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            for nxt in GRAPH[path[-1]]:
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    # A package's __init__ may name its own modules; a module importing its package's __init__ is not a circle.
    circles = []
    for module in GRAPH:
        for target in GRAPH[module]:
            if module.startswith(target + "."):
                continue
            back = reaches(target, module)
            if back and not any(b.startswith(module + ".") or module.startswith(b + ".") for b in back[1:-1]):
                circles.append(" -> ".join([module, *back]))
    assert not circles, circles[:5]


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If):  # TYPE_CHECKING blocks
            for inner in node.body:
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    names.update((alias.asname or alias.name).split(".")[0] for alias in inner.names)
    return names


def test_every_imported_name_exists_where_it_is_imported_from() -> None:
    """Deferred imports (inside functions) run only on some code paths; a name moved away breaks them late."""
    roots = [PACKAGE_DIR, PACKAGE_DIR.parent / "test", PACKAGE_DIR.parent / "scripts"]
    modules = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    missing = []
    for root in roots:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules):
                    continue
                defined = _top_level_names(modules[node.module])
                for alias in node.names:
                    if alias.name not in defined and f"{node.module}.{alias.name}" not in modules:
                        missing.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name}")
    assert not missing, missing


def test_the_tools_depend_one_way_prepare_then_dev_then_cli() -> None:
    """prepare/ imports neither dev/ nor cli/, dev/ may use prepare/, cli/ dispatches to both; the modules
    directly in tools/ (shared by them) import none of the three."""
    order = ("prepare", "dev", "cli")

    def rank(module: str) -> int:
        part = module.removeprefix(f"{TOOLS}.").split(".")[0]
        return order.index(part) + 1 if module.startswith(f"{TOOLS}.") and part in order else 0

    tools = [module for module in GRAPH if module == TOOLS or module.startswith(f"{TOOLS}.")]
    assert {rank(module) for module in tools} == {0, 1, 2, 3}, "tools/ no longer has prepare/, dev/ and cli/"
    wrong = sorted(
        f"{source} -> {target}"
        for source in tools
        for target in GRAPH[source]
        if target.startswith(f"{TOOLS}.") and rank(target) > rank(source)
    )
    assert not wrong, wrong
