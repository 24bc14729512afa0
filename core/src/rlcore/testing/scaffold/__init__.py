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

import importlib.metadata
import keyword
import re
import shutil
import sys
from pathlib import Path
from typing import Final

import attrs

from rlcore.errors import ConfigError

__all__ = ["KINDS", "write_plugin"]

_TEMPLATES = Path(__file__).resolve().parent / "templates"
_NAME = re.compile(r"[a-z][a-z0-9_]*")
# A plugin name is a folder, an import package and part of a test file's name.
MAX_NAME: Final = 64


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
    "harness": _Kind("register_harnesses", ("openai", "rlcore-hf"), '`[agent] harness = "{name}"`'),
    "environment": _Kind("register_environments", (), '`[agent] environment = "{name}"`'),
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
    _check_name(name)
    root = _target(Path(out), name)
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
        if template is None:
            text = f'"""The ``{name}`` rlcore {kind} plugin."""\n'
        else:
            text = (_TEMPLATES / template).read_text(encoding="utf-8")
            for token, value in values.items():
                text = text.replace(token, value)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as err:  # a full disk, a folder made read-only meanwhile
            msg = f"new-plugin: cannot write {path}: {err.strerror or err}; nothing else written"
            shutil.rmtree(root, ignore_errors=True)
            raise ConfigError(msg) from err
        written.append(path)
    return written


def _check_name(name: str) -> None:
    """One line for a name that is no identifier, too long, or shadows a module: a plugin
    package named ``json`` installs fine and then replaces the standard library's for every
    program of the environment."""
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        shown = name if len(name) <= 40 else f"{name[:40]}..."
        msg = (
            f"new-plugin: {shown!r} is not a lower-case Python identifier (letters, digits, _; "
            "it names the plugin and its import package), e.g. my_reward"
        )
        raise ConfigError(msg)
    if len(name) > MAX_NAME:
        msg = (
            f"new-plugin: NAME is {len(name)} characters long; at most {MAX_NAME} (it names "
            "a folder, a package and a test file)"
        )
        raise ConfigError(msg)
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        msg = (
            f"new-plugin: {name!r} is a standard-library module; a plugin package of that "
            f"name would shadow it for every program of the environment; choose another "
            f"NAME, e.g. my_{name}"
        )
        raise ConfigError(msg)
    owners = importlib.metadata.packages_distributions().get(name)
    if owners:
        msg = (
            f"new-plugin: {name!r} is the import name of the installed distribution "
            f"{sorted(owners)[0]}; a plugin package of that name would replace it; choose "
            f"another NAME, e.g. my_{name}"
        )
        raise ConfigError(msg)


def _target(out: Path, name: str) -> Path:
    """``out/name``, checked writable before anything is written: one line for ``--dir``
    naming a file, a folder that cannot be created (``/proc``), or an existing package."""
    if out.exists() and not out.is_dir():
        msg = f"new-plugin: --dir {out} is a file, not a folder; name a folder"
        raise ConfigError(msg)
    root = out / name
    if root.exists():
        msg = f"new-plugin: {root} exists already; choose another NAME or --dir"
        raise ConfigError(msg)
    try:
        out.mkdir(parents=True, exist_ok=True)
        root.mkdir()
    except OSError as err:
        msg = f"new-plugin: cannot create {root}: {err.strerror or err}; choose a writable --dir"
        raise ConfigError(msg) from err
    return root
