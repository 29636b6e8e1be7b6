"""The package's folders are layers that the flow convert → train → evaluate goes through, each importing only from the
ones below it: core < conversion < training < evaluation < commands. A walk over every ``import`` statement (those
inside functions too) fails on an arrow that runs back up and on any import circle between modules."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "causal_qwen"
LAYERS = ("core", "conversion", "training", "evaluation", "commands")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, name: str, is_package: bool = False) -> set[str]:
    """Every ``causal_qwen`` module that module ``name`` (its ``source``) imports; ``from .x import y`` may name a
    module ``y``, so both ``x`` and ``x.y`` are listed (the graph keeps those that exist)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {module for module in found if module.startswith("causal_qwen.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        imported = imported_modules(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        edges[name] = {module for module in imported if module in modules and module != name}
    return edges


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_import_runs_back_up_a_layer():
    upward = [
        f"{module} -> {target}"
        for module, targets in graph().items()
        for target in targets
        if layer(module) is not None and layer(target) is not None and layer(target) > layer(module)
    ]
    assert upward == [], "imports that run back up (core < conversion < training < evaluation < commands)"


def test_no_import_circle():
    edges = graph()
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_walk_sees_imports_inside_functions_and_relative_ones():
    source = "import torch\nfrom . import cauchy\n\ndef f():\n    from ..evaluation.metrics import mdae\n"
    found = imported_modules(source, "causal_qwen.core.modeling")
    assert {"causal_qwen.core.cauchy", "causal_qwen.evaluation.metrics"} <= found
    assert layer("causal_qwen.evaluation.metrics") > layer("causal_qwen.core.modeling")
