"""No import cycle between the core's modules, the layering the architecture promises, and a
plugin API that never reaches the runtime.

The graph is read from the source (ast): every ``import``/``from ... import`` of an ``rlcore``
module, at module level, inside a function **or under** ``if TYPE_CHECKING`` (an annotation-only
import still ties two modules together for a reader, and it is how circles hide). A package
import edge goes to its ``__init__``; ``from pkg import submodule`` goes to the submodule only
(Python runs ``pkg/__init__`` for any of its submodules anyway, so that edge says nothing).
A function-level import still counts: it hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlcore

ROOT = Path(rlcore.__file__).parent

# Bottom to top. A module may import its own layer and the layers below, never one above.
# A top-level name is a module (``rlcore.cli``) or a package (``rlcore.trainer`` and all
# below it); ``rlcore`` is the package's own ``__init__``.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "cache"),
    ("rlcore", "protocol", "hookspecs", "builtin"),
    ("dispatch",),
    ("interfaces",),
    ("engine", "engine_utils", "rl", "reward", "tracking", "plugins"),
    ("config",),
    ("agent", "data", "checkpoint", "workers"),
    ("roles",),
    ("preflight",),
    ("trainer",),
    ("testing", "cli"),
)

# The Ray process boundary: a role module runs inside a worker process, which has no driver
# and runs no preflight check. The layers say so already (both sit above ``roles``); this
# names the rule so that moving a layer cannot quietly drop it.
WORKER_SIDE = "rlcore.roles"
DRIVER_ONLY: tuple[str, ...] = ("rlcore.trainer", "rlcore.preflight")

# Deprecated aliases kept for third-party code; not counted as rooms of the top level.
DEPRECATED: frozenset[str] = frozenset({"engine_utils.py"})

# What a plugin may import: the contracts, the hooks, the errors, the protocol, the engine and
# rollout utilities, the rl numerics, checkpoint safe-loading and the conformance suites. The
# same list is written for plugin authors in core/README.md ("The plugin API").
PLUGIN_API: tuple[str, ...] = (
    "rlcore.interfaces",
    "rlcore.hookspecs",
    "rlcore.errors",
    "rlcore.protocol",
    "rlcore.dispatch",
    "rlcore.engine",
    "rlcore.engine_utils",
    "rlcore.rl",
    "rlcore.checkpoint.safe_load",
    "rlcore.checkpoint.safetensors_header",
)
RUNTIME: tuple[str, ...] = ("rlcore.trainer", "rlcore.workers", "rlcore.cli")

# Known upward imports, to be removed, not added to. (The last one, preflight calling the
# trainer's environment-variable parser, went with the one config channel.)
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, package: str, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            names = submodules or [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _imports(ast.parse(path.read_text()), package, modules) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def layer_of(module: str) -> int:
    top = _top(module)
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    msg = f"{module}: its top-level name {top!r} is in no layer of LAYERS; add it"
    raise AssertionError(msg)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
        for src, deps in graph.items()
        for dst in deps
        if layer_of(dst) > layer_of(src) and (src, dst) not in KNOWN_UPWARD
    )


def worker_side_reaching_the_driver(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a role module (direct or under TYPE_CHECKING) into the driver's side."""
    return sorted(
        f"{src} imports {dst}"
        for src, deps in graph.items()
        if src == WORKER_SIDE or src.startswith(WORKER_SIDE + ".")
        for dst in deps
        if any(dst == d or dst.startswith(d + ".") for d in DRIVER_ONLY)
    )


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_cycle_in_the_core_type_checking_imports_included():
    graph = import_graph()
    assert "rlcore.roles.policy" in graph  # the walk found the modules
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between top-level names (packages and top modules): the rooms of the tree."""
    rooms: dict[str, set[str]] = {}
    for src, deps in graph.items():
        rooms.setdefault(_top(src), set()).update(_top(d) for d in deps if _top(d) != _top(src))
    return rooms


def test_no_import_cycle_between_packages():
    # e.g. workers -> resources -> workers.waiting, or plugins -> rl.builtin -> ... -> plugins:
    # no module cycle, but two packages that each need the other.
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, " -> ".join(cycle or [])


def test_the_package_graph_finds_a_cycle_between_packages():
    graph = {"rlcore.workers.group": {"rlcore.resources"}, "rlcore.resources": {"rlcore.workers.w"}}
    assert find_cycle(package_graph(graph)) == ["resources", "workers", "resources"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_a_type_checking_import_counts(tmp_path):
    pkg = tmp_path / "rlcore"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rlcore.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlcore.a import A\n"
    )
    assert find_cycle(import_graph(pkg)) == ["rlcore.a", "rlcore.b", "rlcore.a"]


def test_every_top_level_module_has_a_layer_and_the_top_level_is_small():
    tops = {_top(m) for m in import_graph()}
    for top in tops:
        layer_of(f"rlcore.{top}" if top != "rlcore" else top)
    entries = [p for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()]
    modules = [p.name for p in entries if p.name not in {"__init__.py", *DEPRECATED}]
    assert len(modules) <= 22, sorted(modules)  # 22: cache (GGUF folders, the matmul peak)


def test_no_import_runs_up_from_a_lower_layer():
    assert upward_imports(import_graph()) == []


def test_the_layer_check_finds_an_upward_import():
    graph = {"rlcore.protocol.dataproto": {"rlcore.trainer.fit"}, "rlcore.trainer.fit": set()}
    assert upward_imports(graph) == [
        "rlcore.protocol.dataproto (layer 1) imports rlcore.trainer.fit (layer 9)"
    ]


def test_role_workers_never_import_the_trainer_or_preflight():
    graph = import_graph()
    assert any(m.startswith(WORKER_SIDE + ".") for m in graph)  # the walk found the roles
    assert worker_side_reaching_the_driver(graph) == []


def test_the_role_check_finds_a_role_importing_the_trainer_or_preflight(tmp_path):
    pkg = tmp_path / "rlcore"
    for sub in ("roles", "trainer", "preflight"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer" / "fit.py").write_text("")
    (pkg / "preflight" / "roles.py").write_text("")
    (pkg / "roles" / "policy.py").write_text("from rlcore.trainer.fit import Trainer\n")
    (pkg / "roles" / "critic.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from rlcore.preflight import roles\n"
    )
    graph = import_graph(pkg)
    assert worker_side_reaching_the_driver(graph) == [
        "rlcore.roles.critic imports rlcore.preflight.roles",
        "rlcore.roles.policy imports rlcore.trainer.fit",
    ]
    # ... and the layers agree: both are imports running up.
    assert len(upward_imports(graph)) == 2


def test_the_plugin_api_never_reaches_the_runtime():
    graph = import_graph()
    for api in PLUGIN_API:
        assert api in graph, f"{api} is on the plugin API list but is no module"
        modules = [m for m in graph if m == api or m.startswith(api + ".")]
        for module in modules:
            bad = sorted(m for m in reachable(graph, module) if m.startswith(RUNTIME))
            assert not bad, f"{module} (plugin API) reaches the runtime: {bad}"


def test_the_plugin_api_list_is_the_documented_one():
    readme = (ROOT.parents[1] / "README.md").read_text()
    section = readme.split("## The plugin API", 1)[1].split("\n## ", 1)[0]
    for api in PLUGIN_API:
        assert f"`{api}`" in section, f"{api} missing from core/README.md's plugin API list"
