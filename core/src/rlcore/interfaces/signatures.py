"""Whether a plugin class's methods take the parameters the contract passes them.

The core calls every abstract method of a base by keyword (``optimizer_step(lr=...)``,
``compute_log_prob(batch, temperature=..., with_entropy=...)``), so a method that lacks one of
the base's keyword-only parameters fails inside a worker, seconds after Ray started, and one
with an extra parameter without a default can never be given it. Two readers share one
comparison: :func:`signature_mismatches` on an imported class (before Ray, when a config
selects it; the conformance suite) and :func:`source_signature_mismatches` on a class's
source (``rlcore plugins``, which imports no plugin backend).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable, Sequence

import attrs

from rlcore.interfaces.version import CONTRACT_NOTE, CONTRACT_VERSION

__all__ = [
    "Mismatch",
    "describe_mismatches",
    "signature_mismatches",
    "source_signature_mismatches",
]


@attrs.frozen(kw_only=True)
class Mismatch:
    """One method whose parameters differ from its base's: what to add, what to remove."""

    method: str
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()

    def __str__(self) -> str:
        parts = []
        if self.add:
            parts.append(f"add {', '.join(self.add)}")
        if self.remove:
            parts.append(f"remove {', '.join(self.remove)} (or give a default)")
        return f"{self.method}({', '.join(parts)})"


def _wanted(base: type, method: str) -> set[str]:
    params = inspect.signature(getattr(base, method)).parameters.values()
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _compare(
    method: str, want: set[str], named: set[str], required_kw: set[str], var_kw: bool
) -> Mismatch | None:
    """``named``: parameters a keyword reaches (positional-or-keyword and keyword-only);
    ``required_kw``: keyword-only ones without a default; ``var_kw``: a ``**kwargs``."""
    add = () if var_kw else tuple(sorted(want - named))
    remove = tuple(sorted(required_kw - want))
    return Mismatch(method=method, add=add, remove=remove) if add or remove else None


def _abstract_methods(bases: Iterable[type]) -> dict[str, type]:
    return {m: b for b in bases for m in sorted(getattr(b, "__abstractmethods__", ()))}


def signature_mismatches(cls: type, bases: Sequence[type]) -> list[Mismatch]:
    """Each abstract method of the first of ``bases`` that ``cls`` subclasses, implemented
    by ``cls`` with parameters the core cannot call it with; [] when all match."""
    base = next((b for b in bases if isinstance(cls, type) and issubclass(cls, b)), None)
    if base is None:
        return []
    found = []
    for method in sorted(getattr(base, "__abstractmethods__", ())):
        implemented = inspect.getattr_static(cls, method, None)
        if implemented is None or implemented is inspect.getattr_static(base, method):
            continue  # not implemented here: abc refuses to build the class anyway
        try:
            params = list(inspect.signature(getattr(cls, method)).parameters.values())
        except (TypeError, ValueError):
            continue  # not introspectable (a C callable): nothing to say
        kinds = inspect.Parameter
        named = {
            p.name for p in params if p.kind in (kinds.KEYWORD_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        }
        required = {
            p.name for p in params if p.kind is kinds.KEYWORD_ONLY and p.default is kinds.empty
        }
        var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)
        mismatch = _compare(method, _wanted(base, method), named, required, var_kw)
        if mismatch is not None:
            found.append(mismatch)
    return found


def source_signature_mismatches(
    tree: ast.Module, class_name: str, bases: Sequence[type]
) -> list[Mismatch]:
    """The same comparison on the methods written in ``class_name``'s body in ``tree``
    (inherited ones are not seen); each is compared with the base that declares it."""
    node = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None
    )
    if node is None:
        return []
    declared = _abstract_methods(bases)
    found = []
    for fn in node.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name not in declared:
            continue
        args = fn.args
        named = {a.arg for a in (*args.args, *args.kwonlyargs)}
        required = {
            a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
        }
        base = declared[fn.name]
        mismatch = _compare(
            fn.name, _wanted(base, fn.name), named, required, args.kwarg is not None
        )
        if mismatch is not None:
            found.append(mismatch)
    return found


def describe_mismatches(mismatches: Sequence[Mismatch]) -> str:
    """The one-line reason: every method with the parameters to add or remove, sorted by
    method, and where the migration note is."""
    methods = "; ".join(str(m) for m in sorted(mismatches, key=lambda m: m.method))
    return (
        f"its methods do not take the parameters of plugin contract {CONTRACT_VERSION}: "
        f"{methods} ({CONTRACT_NOTE})"
    )
