"""A plugin's status read from its source, without importing it (``rlcore plugins``): a module
whose top-level imports are not installed, a class it does not define, or methods that do not
take the contract's parameters are found by parsing the file, so a broken or outdated plugin's
code never runs just to be listed."""

from __future__ import annotations

import ast
import importlib.util

from rlcore.interfaces.signatures import describe_mismatches, source_signature_mismatches

__all__ = ["read_source", "status_from_source"]


def read_source(origin: str | None) -> str | None:
    """The text of a module's ``.py`` file, or None (a compiled module, unreadable)."""
    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def status_from_source(
    source: str, module_name: str, attr_path: str, bases: tuple[type, ...] | None
) -> str:
    """``ok``, ``import error: ...``, ``class missing: ...`` or ``refused: ...`` for the object
    at ``attr_path`` of a module with this source. ``bases``: the contract classes it must
    implement (None for a function kind: resolving it checks what there is to check)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return f"import error: {module_name}: {err.msg} (line {err.lineno})"
    missing = _missing_top_level_imports(tree)
    if missing:
        return f"import error: No module named {missing[0]!r}"
    top = attr_path.split(".")[0]
    if top not in _top_level_names(tree):
        return f"class missing: {module_name!r} defines no {top!r}"
    if bases is None or "." in attr_path:
        return "ok"  # a function, or a nested class: resolving it checks what there is to check
    mismatches = source_signature_mismatches(tree, attr_path, bases)
    return f"refused: {describe_mismatches(mismatches)}" if mismatches else "ok"


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _missing_top_level_imports(tree: ast.Module) -> list[str]:
    """Absolute module-level imports whose top-level package is not installed."""

    missing = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops = [node.module.split(".")[0]]
        else:
            continue
        for top in tops:
            if top != "__future__" and importlib.util.find_spec(top) is None:
                missing.append(top)
    return missing
