"""``rlcore new-plugin KIND NAME``: a plugin package that installs and passes as generated.

:func:`write_plugin` writes ``<out>/<NAME>/``: ``pyproject.toml`` (the distribution, its
``rlcore`` entry point), ``src/<NAME>/plugin.py`` (``contract_version`` and the hook that
names the class), ``src/<NAME>/<kind>.py`` (a working class with an attrs ``Config`` whose
fields carry help text), ``tests/test_<NAME>.py`` (the kind's conformance check from
:mod:`rlcore.testing.conformance`) and a README. The templates are in ``templates/``; every
kind's class works as written, so the author starts from green tests and changes one thing
at a time.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Final

import attrs

from rlcore.errors import ConfigError

__all__ = ["KINDS", "write_plugin"]

_TEMPLATES = Path(__file__).resolve().parent / "templates"
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@attrs.frozen
class _Kind:
    hook: str
    deps: tuple[str, ...]
    select: str  # how a run's TOML selects it (README)


KINDS: Final[dict[str, _Kind]] = {
    "engine": _Kind("register_engines", (), '`[actor.engine] name = "{name}"`'),
    "rollout": _Kind("register_rollouts", ("rlcore-hf",), '`[rollout] name = "{name}"`'),
    "reward": _Kind("register_rewards", (), '`[reward] default = "{name}"`'),
    "algorithm": _Kind("register_algorithms", (), '`[algorithm] name = "{name}"`'),
    "tool": _Kind("register_tools", (), '`[agent] tools = ["{name}"]`'),
}


def _class_name(name: str, kind: str) -> str:
    words = "".join(part.capitalize() for part in name.split("_") if part)
    return words if words.lower().endswith(kind) else words + kind.capitalize()


def write_plugin(kind: str, name: str, out: str | Path = ".") -> list[Path]:
    """Write the ``kind`` plugin package ``name`` into ``out/name``; return the files.

    ``name`` is the registered plugin name and the import package (a lower-case Python
    identifier); the distribution is ``name`` with ``-`` for ``_``. Refuses (one
    :class:`ConfigError` line) an unknown kind, a bad name or an existing folder.
    """
    from rlcore.interfaces import CONTRACT_VERSION

    if kind not in KINDS:
        msg = f"new-plugin: unknown kind {kind!r}; one of {', '.join(KINDS)}"
        raise ConfigError(msg)
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        msg = (
            f"new-plugin: {name!r} is not a lower-case Python identifier (letters, digits, _; "
            "it names the plugin and its import package), e.g. my_reward"
        )
        raise ConfigError(msg)
    root = Path(out) / name
    if root.exists():
        msg = f"new-plugin: {root} exists already; choose another NAME or --dir"
        raise ConfigError(msg)
    spec = KINDS[kind]
    deps = ", ".join(f'"{d}"' for d in ("rlcore", *spec.deps))
    values = {
        "__NAME__": name,
        "__DIST__": name.replace("_", "-"),
        "__CLASS__": _class_name(name, kind),
        "__KIND__": kind,
        "__MODULE__": kind,
        "__HOOK__": spec.hook,
        "__DEPS__": deps,
        "__CONTRACT__": str(CONTRACT_VERSION),
        "__SELECT__": spec.select.format(name=name),
    }
    layout = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        f"src/{name}/__init__.py": None,
        f"src/{name}/plugin.py": "plugin.py.tmpl",
        f"src/{name}/{kind}.py": f"{kind}.py.tmpl",
        f"tests/test_{name}.py": f"test_{kind}.py.tmpl",
    }
    written: list[Path] = []
    for rel, template in layout.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if template is None:
            text = f'"""The ``{name}`` rlcore {kind} plugin."""\n'
        else:
            text = (_TEMPLATES / template).read_text(encoding="utf-8")
            for token, value in values.items():
                text = text.replace(token, value)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
