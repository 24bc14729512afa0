"""``check_plugin_module``: a plugin's entry module is light and registers well-formed names."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_declared_version

__all__ = ["HEAVY_MODULES", "check_plugin_module"]

# Frameworks that discovery must never import (ARCHITECTURE.md: discovery stays fast and works
# where a backend cannot run, e.g. vLLM without a GPU).
HEAVY_MODULES = ("torch", "transformers", "ray", "vllm", "sglang", "megatron")

# Run in a fresh interpreter: imports the module, registers it with a strict in-process
# registry (which calls every hook), then reports what got imported and what was registered.
_PROBE = """
import json, sys
heavy = {heavy!r}
name = {name!r}
out = {{}}
try:
    import importlib
    module = importlib.import_module(name)
    out["contract_version"] = repr(vars(module).get("contract_version"))
    from rlcore.plugins import PluginRegistry
    registry = PluginRegistry(entry_points=False, builtins=False, strict=True)
    registry.register(module, name=name)
    out["entries"] = [[e.kind, e.name, e.target_name] for e in registry.entries()]
    out["problems"] = [p.message for p in registry.problems]
except BaseException as err:
    out["error"] = f"{{type(err).__name__}}: {{err}}"
out["heavy"] = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print("CONFORMANCE-JSON " + json.dumps(out))
"""


def check_plugin_module(
    module_name: str,
    *,
    sys_path: Sequence[str | os.PathLike[str]] = (),
    resolve: bool = True,
    timeout_s: float = 60.0,
) -> dict[str, str]:
    """Check a plugin entry module (the ``[project.entry-points.rlcore]`` target).

    It declares ``contract_version`` equal to :data:`rlcore.interfaces.CONTRACT_VERSION`
    (as :func:`check_contract` checks). In a subprocess: importing it and calling its hooks
    imports none of :data:`HEAVY_MODULES`; it implements at least one known hook, each
    returning a mapping ``name -> "module:Class"`` string (or class), with no duplicate
    names. With ``resolve``
    (default), each target is then imported in this process and must subclass the matching
    ``rlcore.interfaces`` base with an attrs ``Config``. ``sys_path`` entries are prepended to
    the subprocess's path (for a module that is not installed). Returns
    ``{"kind/name": "module:Class"}``.
    """
    what = f"plugin module {module_name!r}"
    code = _PROBE.format(heavy=HEAVY_MODULES, name=module_name)
    paths = [os.fspath(p) for p in sys_path] + [p for p in sys.path if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CONFORMANCE-JSON ")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        fail(what, "importing it must not crash the interpreter", tail[0])
    report = json.loads(lines[-1].removeprefix("CONFORMANCE-JSON "))
    if "contract_version" in report:  # imported: declared for the current contract?
        check_declared_version(what, ast.literal_eval(report["contract_version"]))
    if "error" in report:
        fail(what, "must import and register cleanly with a strict PluginRegistry", report["error"])
    if report["heavy"]:
        fail(
            what,
            "importing the plugin module and calling its hooks must not import "
            f"{'/'.join(HEAVY_MODULES)} (name targets as 'module:Class' strings instead)",
            f"imported {', '.join(report['heavy'][:8])}",
        )
    if report["problems"]:
        fail(what, "hooks must return name -> 'module:Class' mappings", report["problems"][0])
    entries: list[list[str]] = report["entries"]
    if not entries:
        fail(
            what,
            "must implement at least one hook (register_engines, register_rollouts, "
            "register_rewards, register_algorithms) returning a non-empty mapping",
            "no names registered",
        )
    if resolve:
        _resolve_all(module_name, what, [os.fspath(p) for p in sys_path])
    return {f"{kind}/{name}": target for kind, name, target in entries}


def _resolve_all(module_name: str, what: str, extra: list[str]) -> None:
    import importlib

    from rlcore.errors import PluginError
    from rlcore.plugins import PluginRegistry

    added = [p for p in extra if p not in sys.path]
    sys.path[:0] = added
    try:
        module = importlib.import_module(module_name)
    finally:
        for p in added:
            sys.path.remove(p)
    registry = PluginRegistry(entry_points=False, builtins=False, strict=True)
    registry.register(module, name=module_name)
    for entry in registry.entries():
        try:
            registry.resolve(entry.kind, entry.name)
        except PluginError as err:
            fail(what, "every registered target must import and subclass its base", str(err))
