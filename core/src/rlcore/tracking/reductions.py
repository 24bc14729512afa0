"""How each metric is reduced: declared per metric, not guessed from its name.

A worker call returns lists of values per metric (one per rank, or per mini-batch); the driver
turns each list into one float with the metric's :class:`Reduction`, and when a step calls the
same worker method twice (two forward passes) it combines the two calls' values with the
metric's ``calls`` rule. A metric nobody declared is averaged over ranks and the last call
wins, which is right for losses, ratios and fractions.

Declarations are exact names, or families ending in ``/`` (every ``timing_s/worker/<phase>``
is one declaration: the phases are open-ended)::

    from rlcore.tracking.reductions import MAX, declare_reduction
    declare_reduction("actor/my_loss_max", MAX)

A plugin declares its own metrics at import of the module that reports them on the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

__all__ = [
    "LAST",
    "MAX",
    "MEAN",
    "MIN",
    "SUM",
    "Reduction",
    "combine_calls",
    "declare_reduction",
    "reduce_metrics",
    "reduction_of",
]

Over = Literal["mean", "sum", "max", "min", "last"]


@attrs.frozen(kw_only=True)
class Reduction:
    """``ranks``: how one call's list of values becomes one float; ``calls``: how the values
    of several calls in one step combine (``"sum"`` adds them, ``"last"`` keeps the newest)."""

    ranks: Over = "mean"
    calls: Literal["sum", "last"] = "last"


MEAN = Reduction(ranks="mean")
SUM = Reduction(ranks="sum")
MAX = Reduction(ranks="max")
MIN = Reduction(ranks="min")
LAST = Reduction(ranks="last")
# The driver waits for the slowest rank, so its time is the one that adds up to the step; two
# calls of one phase in a step (e.g. two forward passes) both took time.
WORKER_TIME = Reduction(ranks="max", calls="sum")

_DECLARED: dict[str, Reduction] = {
    "timing_s/": Reduction(ranks="max"),  # driver-side phase times reported by a worker
    "timing_s/worker/": WORKER_TIME,
    "rollout/logprob_diff_max": MAX,  # a maximum over ranks is the largest rank's
    "perf/peak_rss_gb/": MAX,  # per role: the process closest to running out of memory
}


def declare_reduction(name: str, reduction: Reduction) -> None:
    """Declare how metric ``name`` (or the family ``name`` when it ends in ``/``) reduces.

    A second, different declaration of the same name is an error: two producers disagree.
    """
    known = _DECLARED.get(name)
    if known is not None and known != reduction:
        msg = f"metric {name!r} is already declared as {known}, not {reduction}"
        raise ValueError(msg)
    _DECLARED[name] = reduction


def reduction_of(name: str) -> Reduction:
    """The declared reduction of ``name``: its own, else its longest declared family, else mean."""
    own = _DECLARED.get(name)
    if own is not None:
        return own
    best: tuple[int, Reduction] | None = None
    for family, reduction in _DECLARED.items():
        longer = best is None or len(family) > best[0]
        if family.endswith("/") and name.startswith(family) and longer:
            best = (len(family), reduction)
    return best[1] if best is not None else MEAN


def _over(values: Sequence[float], how: Over) -> float:
    if how == "last":
        return float(values[-1])
    if how == "sum":
        return float(sum(values))
    if how == "max":
        return float(max(values))
    if how == "min":
        return float(min(values))
    # float64 mean, as numpy's: the same float for the same values on every platform
    import numpy as np

    return float(np.asarray(values, dtype=np.float64).mean())


def reduce_metrics(metrics: Mapping[str, Sequence[float] | float]) -> dict[str, float]:
    """Per-rank (and per-mini-batch) lists -> one float per metric, by its declared ``ranks``.

    A plain number stays itself; an empty list is left out (nothing was measured).
    """
    out: dict[str, float] = {}
    for key, values in metrics.items():
        if isinstance(values, int | float):
            out[key] = float(values)
        elif len(values):
            out[key] = _over(list(values), reduction_of(key).ranks)
    return out


def combine_calls(into: dict[str, float], new: Mapping[str, float]) -> None:
    """Merge one call's reduced metrics into the step's, by each metric's declared ``calls``."""
    for key, value in new.items():
        if reduction_of(key).calls == "sum" and key in into:
            into[key] = into[key] + value
        else:
            into[key] = value
