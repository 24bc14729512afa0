"""The child process of one harness run (``[agent] harness_isolation = "process"``).

``python -m rlcore.agent.harness_child REQUEST.json RESULT.json``: caps its own address space
(``RLIMIT_AS``) before importing anything of the harness, builds the harness (and the
environment) from their ``"module:Class"`` targets and JSON options, runs it, and writes
``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "..."}`` as JSON. Only JSON
crosses the process boundary: nothing is unpickled.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _build(target: str, options: dict[str, Any] | None) -> Any:
    cls = _load(target)
    config = cls.Config(**options) if options else None
    return cls(config)


def main(request_path: str, result_path: str) -> int:
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    try:
        import resource

        limit = int(request["memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # a platform without it: the time bound stays
        pass
    outcome: dict[str, Any]
    try:
        from rlcore.agent.harness import GuardedEnvironment
        from rlcore.interfaces import HarnessResult, HarnessTask

        harness = _build(request["harness"], request.get("harness_options"))
        task = HarnessTask.from_json(request["task"])
        if request.get("environment"):
            env = _build(request["environment"], request.get("environment_options"))
            task = task.with_environment(GuardedEnvironment(env, request["environment_name"]))
        value = harness.run(task, request["base_url"], request["api_key"])
        result = HarnessResult.coerce(value)
        if result is None:
            outcome = {"ok": False, "kind": "empty", "error": f"returned {type(value).__name__}"}
        else:
            outcome = {"ok": True, "result": result.to_json()}
    except BaseException as err:  # the harness's own failure, reported to the parent
        kind = "env" if type(err).__name__ == "EnvironmentStepError" else "crash"
        outcome = {"ok": False, "kind": kind, "error": f"{type(err).__name__}: {err}"[:500]}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(outcome, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
