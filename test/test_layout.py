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


# -- the layer order: which top-level part of the package may import which ----------------------------------------

# Low to high; a module imports modules of its own layer and lower ones only. "__init__" is the package's own
# __init__.py (the library's front door), "__main__" the CLI's entry point.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "choices", "timing", "pcm"),
    ("llama", "playback"),
    ("model",),
    ("text", "codec"),
    ("config",),
    ("synthesis", "synthesizer", "serving", "audio_output"),
    ("http", "backends", "__init__"),
    ("ros", "tools"),
    ("__main__",),
)
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}
# Pairs within one layer that must not import each other (either way).
APART = ({"text", "codec"}, {"ros", "tools"})


def _part(module: str) -> str:
    """The top-level part of the package a module belongs to: ``moss_tts_node.codec.base`` -> ``codec``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _located_imports() -> list[tuple[str, str, str]]:
    """(``file:line``, importing module, imported module) for every import of a package module, deferred and
    TYPE_CHECKING ones included. ``from P import m`` imports the module ``P.m`` where there is one, else ``P``."""
    modules = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    found = []
    for name, path in sorted(modules.items()):
        where = path.relative_to(PACKAGE_DIR.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                    for alias in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            found += [(f"{where}:{node.lineno}", name, t) for t in dict.fromkeys(targets) if t in modules]
    return found


def _layer_violations(imports: list[tuple[str, str, str]]) -> list[str]:
    wrong = []
    for where, source, target in imports:
        low, high = _part(target), _part(source)
        if low == high:
            continue
        if low not in LAYER_OF or high not in LAYER_OF:
            unplaced = high if high not in LAYER_OF else low
            wrong.append(f"{where}: {source} imports {target}, but {unplaced!r} has no place in LAYERS")
        elif LAYER_OF[low] > LAYER_OF[high]:
            wrong.append(
                f"{where}: {source} imports {target}, which is above it ({high!r} is layer "
                f"{LAYER_OF[high]}, {low!r} layer {LAYER_OF[low]}: import only your own layer or lower)"
            )
        elif {low, high} in APART:
            wrong.append(f"{where}: {source} imports {target}, but {high!r} and {low!r} must not import each other")
    return wrong


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {_part(_module_name(path)) for path in PACKAGE_DIR.rglob("*.py")}
    assert parts == set(LAYER_OF), (
        f"place these in LAYERS: {sorted(parts - set(LAYER_OF))}; gone: {sorted(set(LAYER_OF) - parts)}"
    )


def test_imports_only_run_down_the_layers() -> None:
    wrong = _layer_violations(_located_imports())
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_names_the_import_and_the_rule() -> None:
    """The check itself on imports that break each rule (what the two tests above would report)."""
    assert _layer_violations(
        [
            ("moss_tts_node/model/sampling.py:7", "moss_tts_node.model.sampling", "moss_tts_node.config"),
            ("moss_tts_node/codec/base.py:9", "moss_tts_node.codec.base", "moss_tts_node.text.pieces"),
            ("moss_tts_node/tools/cli.py:3", "moss_tts_node.tools.cli", "moss_tts_node.ros.node"),
            ("moss_tts_node/ros/node.py:5", "moss_tts_node.ros.node", "moss_tts_node.model.delay"),
            ("moss_tts_node/speech.py:2", "moss_tts_node.speech", "moss_tts_node.errors"),
        ]
    ) == [
        "moss_tts_node/model/sampling.py:7: moss_tts_node.model.sampling imports moss_tts_node.config, which is above "
        "it ('model' is layer 2, 'config' layer 4: import only your own layer or lower)",
        "moss_tts_node/codec/base.py:9: moss_tts_node.codec.base imports moss_tts_node.text.pieces, "
        "but 'codec' and 'text' must not import each other",
        "moss_tts_node/tools/cli.py:3: moss_tts_node.tools.cli imports moss_tts_node.ros.node, "
        "but 'tools' and 'ros' must not import each other",
        "moss_tts_node/speech.py:2: moss_tts_node.speech imports moss_tts_node.errors, "
        "but 'speech' has no place in LAYERS",
    ]
