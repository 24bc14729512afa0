"""Every ``torch.distributed`` name the trainers use exists in the oldest torch they allow.

rlcore-fsdp2 and rlcore-megatron declare ``torch>=2.6``; the FSDP2 weight sync once called
``dist.all_gather_single``, which torch added in 2.13, so the first GPU run (torch 2.11) died at
its first weight sync while every test here, on torch 2.13, passed. This test reads the sources
(ast, nothing imported) for ``dist.NAME`` / ``dcp.NAME`` uses and ``from torch.distributed... import
NAME``, and checks each against the names torch 2.6.0 binds, read from its source into
``tests/data/torch_2_6_distributed.json`` by ``scripts/torch_api_names.py`` (regenerate with it
when a new torch.distributed module is imported).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Sources that run under the engines' torch>=2.6 floor (the core's workers and checkpoints too).
SCANNED = [
    ROOT / "plugins/engines/fsdp2/src",
    ROOT / "plugins/engines/megatron/src",
    ROOT / "core/src/rlcore",
]
FLOOR = ROOT / "tests/data/torch_2_6_distributed.json"


def _uses(tree: ast.AST) -> set[tuple[str, str]]:
    aliases: dict[str, str] = {}  # local name -> torch.distributed module
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch.distributed") and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "torch.distributed"
        ):
            assert node.module is not None
            for a in node.names:
                found.add((node.module, a.name))
                aliases.setdefault(a.asname or a.name, f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in aliases:
            module = aliases[base.id]
            found.add((module, node.attr))
        elif (
            isinstance(base, ast.Attribute)
            and base.attr == "distributed"
            and isinstance(base.value, ast.Name)
            and base.value.id == "torch"
        ):
            found.add(("torch.distributed", node.attr))
    return found


def used_torch_api(roots: list[Path]) -> set[tuple[str, str]]:
    """(module, name) pairs of ``torch.distributed`` that the sources under ``roots`` use."""
    used: set[tuple[str, str]] = set()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            used |= _uses(ast.parse(path.read_text(encoding="utf-8")))
    return used


def test_every_torch_distributed_name_exists_in_torch_2_6():
    floor = json.loads(FLOOR.read_text())
    assert floor["torch"].startswith("2.6.")
    modules: dict[str, list[str] | None] = floor["modules"]
    used = used_torch_api(SCANNED)
    assert ("torch.distributed", "barrier") in used  # the scan sees the engines
    missing = []
    for module, name in sorted(used):
        if module not in modules:
            # an alias of an imported name (``from torch.distributed import fsdp``) or a new
            # module: the floor list must name it
            parent = module.rpartition(".")[0]
            if module.rpartition(".")[2] in (modules.get(parent) or []):
                continue
            missing.append(f"{module} (not in {FLOOR.name}: regenerate it)")
        elif modules[module] is None:
            missing.append(f"{module} (no such module in torch {floor['torch']})")
        elif name not in modules[module]:
            missing.append(f"{module}.{name}")
    assert not missing, f"absent in torch {floor['torch']} (the engines allow torch>=2.6): " + (
        ", ".join(missing)
    )


def test_the_check_catches_all_gather_single():
    """all_gather_single (torch 2.13+) is not in the 2.6 list, all_gather_into_tensor is."""
    names = json.loads(FLOOR.read_text())["modules"]["torch.distributed"]
    assert "all_gather_single" not in names
    assert "all_gather_into_tensor" in names
    tree = ast.parse("import torch.distributed as dist\ndist.all_gather_single(a, b)\n")
    assert ("torch.distributed", "all_gather_single") in _uses(tree)
