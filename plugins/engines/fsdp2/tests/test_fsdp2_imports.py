"""No import circle inside rlcore_fsdp2 (``TYPE_CHECKING`` and function-level imports count).

LoRA was free functions that took the engine, so ``engine`` and ``lora`` imported each other;
the engine now holds a :class:`~rlcore_fsdp2.lora.LoraAdapter` and both take the gather from
``weights``. Read from the source (ast), as the core's import-graph test reads the core.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlcore_fsdp2

PACKAGE = Path(rlcore_fsdp2.__file__).parent


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "rlcore_fsdp2":
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "rlcore_fsdp2."
            ):
                found.add(node.module.split(".")[1])  # type: ignore[union-attr]
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.split(".")[1] for a in node.names if a.name.startswith("rlcore_fsdp2.")
                }
        graph[name] = found - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    def walk(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                return [*path[path.index(nxt) :], nxt]
            if found := walk(nxt, [*path, nxt]):
                return found
        return None

    for start in sorted(graph):
        if found := walk(start, [start]):
            return found
    return None


def test_no_import_circle_in_the_fsdp2_package():
    graph = _graph()
    assert "lora" in graph["engine"]  # the walk sees the engine's imports
    assert "engine" not in graph["lora"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_circle_finder_finds_one():
    assert _cycle({"engine": {"lora"}, "lora": {"engine"}}) == ["engine", "lora", "engine"]
