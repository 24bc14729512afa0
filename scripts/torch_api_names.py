"""List the public names of ``torch.distributed`` modules in a torch release, read from its source.

    python scripts/torch_api_names.py TORCH_SRC_ROOT > tests/data/torch_2_6_distributed.json

``TORCH_SRC_ROOT`` holds ``torch/`` of that release (for instance the wheel unzipped:
``python -m zipfile -e torch-2.6.0-...whl DIR``; nothing is imported or run). The modules listed
are those the plugins with a ``torch>=2.6`` floor import (``tests/test_torch_floor_api.py`` scans
them); a module's names are what its top level binds (defs, classes, assignments, imports,
``from .x import *`` resolved through ``x.__all__``), conditional branches included.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_torch_floor_api import SCANNED, used_torch_api  # noqa: E402


def _module_file(src: Path, module: str) -> Path | None:
    base = src.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements of the module level, through if/try/with blocks (not into defs)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for field in ("body", "orelse", "finalbody"):
            if isinstance(node, ast.If | ast.Try | ast.With) and hasattr(node, field):
                out.extend(_top_level(getattr(node, field)))
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                out.extend(_top_level(handler.body))
    return out


def _resolve(module: str, name: str | None, level: int, package: str) -> str:
    if level == 0:
        return name or ""
    parts = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(parts + ([name] if name else []))


def module_names(src: Path, module: str, seen: set[str] | None = None) -> set[str] | None:
    """The names ``module`` binds at its top level, or None where the release has no such module."""
    seen = seen if seen is not None else set()
    if module in seen:
        return set()
    seen.add(module)
    path = _module_file(src, module)
    if path is None:
        return None
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(package, node.module, node.level, package)
            for alias in node.names:
                if alias.name == "*":
                    names |= star_names(src, source, seen)
                else:
                    names.add(alias.asname or alias.name)
    # Submodules are attributes once imported anywhere; list the package's own children.
    if path.name == "__init__.py":
        for child in path.parent.iterdir():
            if child.suffix == ".py" and child.stem != "__init__":
                names.add(child.stem)
            elif (child / "__init__.py").is_file():
                names.add(child.name)
    return names


def star_names(src: Path, module: str, seen: set[str]) -> set[str]:
    """What ``from module import *`` binds: its ``__all__`` where it has one."""
    path = _module_file(src, module)
    if path is None:  # a compiled module (torch._C...): nothing readable here
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    declared: list[str] | None = None
    for node in _top_level(tree.body):
        value = None
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value, declared = node.value, []
        elif isinstance(node, ast.AugAssign) and getattr(node.target, "id", "") == "__all__":
            value = node.value
        if value is not None and isinstance(value, ast.List | ast.Tuple):
            declared = (declared or []) + [
                e.value for e in value.elts if isinstance(e, ast.Constant)
            ]
    if declared is not None:
        return set(declared)
    return {n for n in (module_names(src, module, set(seen)) or set()) if not n.startswith("_")}


def main() -> int:
    src = Path(sys.argv[1])
    version_file = src / "torch" / "version.py"
    version = version_file.read_text().split("__version__ = ")[1].split("\n")[0].strip("'\"")
    modules: dict[str, list[str] | None] = {}
    for module in sorted({m for m, _ in used_torch_api(SCANNED)}):
        found = module_names(src, module)
        modules[module] = sorted(found) if found is not None else None
    json.dump({"torch": version, "modules": modules}, sys.stdout, indent=0)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
