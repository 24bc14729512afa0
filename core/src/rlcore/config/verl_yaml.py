"""Reading a verl config as verl reads it: YAML through OmegaConf's loader, ``${...}`` resolved
with OmegaConf's semantics, and every size bounded so that hostile input costs one line.

verl loads its configs with Hydra, that is OmegaConf, whose YAML loader differs from plain
YAML 1.1 in three ways kept here (``omegaconf._utils.get_yaml_loader``): ``1e-6`` is a float
(YAML 1.1 wants a dot: ``1.0e-6``), timestamps stay strings, and a key given twice is an
error. The loader also bounds what PyYAML does not: the file's size, the nesting depth (the
composer recurses once per level: 50,000 ``[`` were a 2,996-line ``RecursionError``) and the
nodes an alias expands to (a "billion laughs" file never finished converting). verl's own
configs are ~30 KB, 6 levels deep, and use no aliases.

Interpolations follow OmegaConf: ``${a.b}`` (absolute), ``${.b}``/``${..b}`` (relative to the
key's table), whole-value references keep the referenced type, embedded ones become text;
``${oc.select:path,default}``. ``${oc.env:VAR}`` is *not* resolved: the value is the
environment of the machine verl runs on, and copying this machine's environment into a file
would freeze it and could write a secret (a token) to disk; the key is listed as not mapped
instead, like any other resolver (``oc.decode``, a custom one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlcore.errors import ConfigError

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "Unresolved",
    "expand",
    "load_yaml_text",
    "read_yaml_file",
    "resolve",
]

MAX_BYTES = 4 * 1024 * 1024  # verl's largest generated config is ~30 KB
MAX_DEPTH = 64  # nesting levels (verl's deepest key is 6 levels)
MAX_NODES = 200_000  # YAML nodes after expanding aliases (verl's ppo_trainer: ~1,500)

# OmegaConf's float resolver (omegaconf/_utils.py, get_yaml_loader), YAML 1.2's float
# syntax: an exponent without a dot (1e-6) is a float, as in verl's actor.yaml.
_OMEGACONF_FLOAT = re.compile(
    r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Refused(Exception):
    """A limit the YAML broke: its one-line reason."""


def _loader() -> type:
    import yaml

    class VerlLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0
            self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, height)

        def compose_node(self, parent: Any, index: Any) -> Any:
            alias = self.check_event(yaml.AliasEvent)
            if alias:
                event = self.peek_event()
                target = self.anchors.get(event.anchor)
                if target is not None and id(target) not in self._measured:
                    line = event.start_mark.line + 1
                    msg = f"alias *{event.anchor} at line {line} refers to its own anchor"
                    raise _Refused(msg)
                node = super().compose_node(parent, index)
            else:
                self._depth += 1
                if self._depth > MAX_DEPTH:
                    line = self.peek_event().start_mark.line + 1
                    msg = f"nested deeper than {MAX_DEPTH} levels at line {line}"
                    raise _Refused(msg)
                node = super().compose_node(parent, index)
                self._depth -= 1
                self._measured[id(node)] = self._measure(node)
            size, height = self._measured[id(node)]
            line = node.start_mark.line + 1
            if self._depth + height > MAX_DEPTH:  # an alias can nest a table in itself
                msg = f"nested deeper than {MAX_DEPTH} levels through aliases at line {line}"
                raise _Refused(msg)
            if size > MAX_NODES:
                msg = (
                    f"expands to more than {MAX_NODES:,} values through aliases at line {line} "
                    "(an alias bomb?)"
                )
                raise _Refused(msg)
            return node

        def _measure(self, node: Any) -> tuple[int, int]:
            if isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                return 1, 0
            sizes = [self._measured[id(c)] for c in children]
            return 1 + sum(s for s, _ in sizes), 1 + max((h for _, h in sizes), default=0)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            for key_node, _ in node.value:
                if key_node.tag != "tag:yaml.org,2002:str":
                    continue
                if key_node.value in seen:
                    line = key_node.start_mark.line + 1
                    msg = f"key {key_node.value!r} given twice (line {line}; OmegaConf refuses it)"
                    raise _Refused(msg)
                seen.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    VerlLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float", _OMEGACONF_FLOAT, list("-+0123456789.")
    )
    VerlLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in VerlLoader.yaml_implicit_resolvers.items()
    }
    return VerlLoader


_LOADER: type | None = None


def load_yaml_text(text: str, what: str) -> Any:
    """``text`` parsed as OmegaConf parses YAML, within the limits above; ``what`` names it."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _loader()
    if len(text) > MAX_BYTES:
        msg = f"{what} is larger than {MAX_BYTES // 1024 // 1024} MiB"
        raise ConfigError(msg)
    loader = _LOADER(text)
    try:
        return loader.get_single_data()
    except _Refused as err:
        msg = f"{what}: {err}"
        raise ConfigError(msg) from None
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        msg = f"invalid YAML in {what}: {first}{where}"
        raise ConfigError(msg) from None
    except ValueError as err:  # int("1" + 5000 * "0"): Python's digit limit
        msg = f"{what}: {str(err).split(';')[0]}"
        raise ConfigError(msg) from None
    except RecursionError:  # a construct the limits above missed: still one line
        msg = f"{what}: nested too deeply to read"
        raise ConfigError(msg) from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path) -> Any:
    """The file's YAML (at most :data:`MAX_BYTES` read), or one line naming what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        msg = f"verl config '{path}' not found"
        raise ConfigError(msg) from None
    except OSError as err:
        msg = f"cannot read verl config '{path}': {err.strerror or err}"
        raise ConfigError(msg) from None
    if len(raw) > MAX_BYTES:
        msg = f"verl config '{path}' is larger than {MAX_BYTES // 1024 // 1024} MiB"
        raise ConfigError(msg)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = f"verl config '{path}' is not UTF-8 text (byte {err.start})"
        raise ConfigError(msg) from None
    return load_yaml_text(text, f"verl config '{path}'")


# --- interpolation ---------------------------------------------------------------------------


class Unresolved:
    """A value from-verl does not resolve (``${oc.env:...}``, another resolver): its reason."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Unresolved({self.why!r})"


class _NotResolved(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


_MISSING = object()


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside ``${...}``, brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _closing(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``${`` at ``start`` (-1: none)."""
    depth = 0
    for i in range(start, len(text)):
        if text.startswith("${", i):
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def resolve(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``${...}`` in ``flat`` (dotted key -> value) resolved as OmegaConf would.

    A value that needs ``${oc.env:...}`` or another resolver becomes :class:`Unresolved`;
    a reference to a key that does not exist, or a cycle, is one line (verl stops on them too).
    """
    done: dict[str, Any] = {}
    active: list[str] = []

    def node(path: str) -> Any:
        if path in flat:
            return get(path)
        prefix = path + "."
        sub = [k for k in flat if k.startswith(prefix)]
        if not sub:
            return _MISSING
        table: dict[str, Any] = {}
        for k in sub:
            parts = k[len(prefix) :].split(".")
            t = table
            for part in parts[:-1]:
                t = t.setdefault(part, {})
            t[parts[-1]] = get(k)
        return table

    def absolute(ref: str, key: str) -> str:
        if not ref.startswith("."):
            return ref
        dots = len(ref) - len(ref.lstrip("."))
        base = key.split(".")[:-dots]
        return ".".join([*base, ref[dots:]])

    def argument(text: str, key: str) -> Any:
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        if "${" in text:
            return interpolate(text, key)
        return load_yaml_text(text, f"interpolation argument {text!r} of {key}") if text else ""

    def evaluate(expr: str, key: str) -> Any:
        expr = expr.strip()
        head, *rest = _split_top(expr, ":")
        if not rest:  # a node path: ${a.b}, ${.b}, ${..b}
            ref = absolute(interpolate(expr, key) if "${" in expr else expr, key)
            value = node(ref)
            if value is _MISSING:
                msg = f"{key} = ${{{expr}}}: interpolation key '{ref}' not found"
                raise ConfigError(msg)
            return value
        name, args = head.strip(), expr[len(head) + 1 :]
        if name == "oc.select":  # the default when the key is absent or ??? (MISSING)
            path, *default = _split_top(args, ",")
            value = node(absolute(path.strip(), key))
            if value is _MISSING or value == "???":
                return argument(default[0], key) if default else None
            return value
        if name == "oc.env":
            var = _split_top(args, ",")[0].strip()
            raise _NotResolved(
                f"${{oc.env:{var}}} reads the environment where verl runs; from-verl copies "
                "no environment value into a file: set the rlcore key in the TOML"
            )
        raise _NotResolved(f"resolver {name!r} is not evaluated by from-verl")

    def interpolate(text: str, key: str) -> Any:
        pieces: list[Any] = []
        i = 0
        while i < len(text):
            if text.startswith("\\${", i):  # OmegaConf's escape: a literal ${
                pieces.append("${")
                i += 3
                continue
            if text.startswith("${", i):
                end = _closing(text, i)
                if end < 0:
                    msg = f"{key} = {text!r}: '${{' without its closing '}}'"
                    raise ConfigError(msg)
                pieces.append(evaluate(text[i + 2 : end], key))
                i = end + 1
                continue
            nxt = text.find("$", i + 1)
            nxt = len(text) if nxt < 0 else nxt
            pieces.append(text[i:nxt])
            i = nxt
        if len(pieces) == 1 and text.startswith("${"):
            return pieces[0]  # a whole-value reference keeps the referenced type
        joined = "".join(p if isinstance(p, str) else _text(p) for p in pieces)
        if len(joined) > MAX_BYTES:  # "${a}${a}" doubling through a chain of keys
            msg = f"{key}: its interpolations expand to more than {MAX_BYTES >> 20} MiB of text"
            raise ConfigError(msg)
        return joined

    def get(key: str) -> Any:
        if key in done:
            if isinstance(done[key], _NotResolved):
                raise done[key]
            return done[key]
        if key in active:
            cycle = " -> ".join([*active[active.index(key) :], key])
            msg = f"interpolation cycle: {cycle}"
            raise ConfigError(msg)
        value = flat[key]
        if isinstance(value, str) and "${" in value:
            if len(active) >= MAX_DEPTH:  # each link costs Python frames: stop well before
                msg = f"{active[0]}: a chain of more than {MAX_DEPTH} interpolations"
                raise ConfigError(msg)
            active.append(key)
            try:
                value = interpolate(value, key)
            except _NotResolved as err:
                done[key] = err
                raise
            finally:
                active.pop()
        done[key] = value
        return value

    out: dict[str, Any] = {}
    for key in flat:
        try:
            out[key] = get(key)
        except _NotResolved as err:
            out[key] = Unresolved(err.why)
    return out


def _leaves(value: Any, memo: dict[int, int]) -> int:
    """Leaves of ``value`` once flattened; tables shared by references are counted once each
    (memo by identity), without recursion (references can nest tables deeply)."""
    if not isinstance(value, dict) or not value:
        return 1
    stack: list[tuple[dict[str, Any], bool]] = [(value, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in memo:
            continue
        kids = [c for c in node.values() if isinstance(c, dict) and c]
        if children_done:
            memo[id(node)] = sum(
                memo[id(c)] if isinstance(c, dict) and c else 1 for c in node.values()
            )
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in kids if id(c) not in memo)
    return memo[id(value)]


def expand(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """``resolved`` with each value that is a table (a ``${...}`` to a table) flattened into
    dotted keys, at most :data:`MAX_NODES` in all: a table whose keys refer to tables that
    refer to tables doubles at each link."""
    memo: dict[int, int] = {}
    total = 0
    for key, value in resolved.items():
        total += _leaves(value, memo)
        if total > MAX_NODES:
            msg = f"{key}: the config's interpolations expand to more than {MAX_NODES:,} values"
            raise ConfigError(msg)
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any]] = list(reversed(list(resolved.items())))
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict) and value:
            stack.extend((f"{key}.{k}", v) for k, v in reversed(value.items()))
        else:
            out[key] = value
    return out


def _text(value: Any) -> str:
    # OmegaConf's str() of a node embedded in a string: Python's str of the value.
    return str(value)
