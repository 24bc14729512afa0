"""``rlcore plot RUN_DIR``: PNG curves from a run's ``metrics.jsonl``.

Written to ``RUN_DIR/plots`` by default: ``summary.png``, one page with every panel that has
data side by side, then one PNG per such panel: reward (``critic/score/mean``), validation
accuracy (``val/*/acc``, else ``val/*/score``, one line per data source), KL
(``actor/ppo_kl``, ``actor/kl_loss``), entropy (``actor/entropy``), response length
(``response_length/mean``) and step time (``timing_s/step``). A KL that is 0 at every step
(a run without a KL term) is named in a note on its panel, not drawn as a line at 0.
matplotlib is an optional dependency: ``pip install 'rlcore[plot]'``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcore.errors import DataError, RlcoreError, require_file

log = logging.getLogger(__name__)

__all__ = ["PANELS", "SUMMARY_NAME", "draw_panel", "load_metrics", "main", "plot_run"]

SUMMARY_NAME = "summary.png"

# (file stem, title, y label, metric keys or a "val/" selector)
PANELS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("reward", "Training reward", "mean score", ("critic/score/mean",)),
    ("val_accuracy", "Validation accuracy", "accuracy", ("val/",)),
    ("kl", "KL divergence to the old / reference policy", "KL", ("actor/ppo_kl", "actor/kl_loss")),
    ("entropy", "Policy entropy", "entropy", ("actor/entropy",)),
    ("response_length", "Response length", "tokens", ("response_length/mean",)),
    ("step_time", "Step time", "seconds", ("timing_s/step",)),
    ("mfu", "Model FLOPs utilisation", "MFU", ("perf/mfu/update", "perf/mfu/generate")),
)

Series = dict[str, tuple[list[int], list[float]]]


def load_metrics(path: str | os.PathLike[str]) -> Series:
    """``metric -> (steps, values)`` sorted by step; a step logged twice (a resumed run) keeps
    its last value. A line that is not a JSON object (a crash mid-write, a byte that is not
    UTF-8, a number or nesting past what Python's json reads) is skipped: the file is the
    run's own record, and one bad line must not hide the rest. The skipped lines are counted
    in one warning."""
    hint = ": is this a run directory (with metrics.jsonl)?"
    file = require_file(path, "metrics file", error=DataError, hint=hint)
    by_key: dict[str, dict[int, float]] = {}
    skipped: list[int] = []
    with file.open("rb") as fh:  # bytes: one undecodable line must not end the read
        for lineno, raw in enumerate(fh, start=1):
            row = _json_object(raw)
            if row is None:
                if raw.strip():
                    skipped.append(lineno)
                continue
            step = row.pop("step", None)
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            for key, value in row.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    try:
                        by_key.setdefault(key, {})[step] = float(value)
                    except OverflowError:  # an integer past float range: not a curve point
                        continue
    if skipped:
        log.warning(
            "%s: skipped %d line(s) that are not JSON objects (first: line %d)",
            file,
            len(skipped),
            skipped[0],
        )
    return {
        key: ([s for s in sorted(points)], [points[s] for s in sorted(points)])
        for key, points in by_key.items()
    }


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """The JSON object on one line of the metrics file, or None for anything else."""
    try:
        row = json.loads(raw.decode("utf-8"))
    # UnicodeDecodeError and JSONDecodeError are ValueErrors, and so is an integer past
    # Python's int-string limit; RecursionError: nesting deeper than the interpreter's stack.
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None


def _val_keys(series: Series) -> list[str]:
    val = [k for k in series if k.startswith("val/")]
    acc = sorted(k for k in val if k.endswith("/acc") or k.endswith("/acc/mean"))
    return acc or sorted(k for k in val if k.endswith("/score") or k.endswith("/score/mean"))


Panel = tuple[str, str, str, list[str]]


# Panels whose metrics are logged as 0.0 when the run has no such term: the KL of a run with
# no KL loss, no KL in the reward and one on-policy update (its ratio is 1). A reward of 0 at
# every step, on the other hand, is a measurement.
_ZERO_MEANS_ABSENT = frozenset({"kl"})


def _never_computed(series: Series, stem: str, key: str) -> bool:
    """Whether ``key`` of panel ``stem`` is 0 at every step where that means "not computed"."""
    return stem in _ZERO_MEANS_ABSENT and all(value == 0.0 for value in series[key][1])


def draw_panel(
    ax: Any, series: Series, stem: str, title: str, ylabel: str, keys: list[str]
) -> None:
    """One panel on ``ax``: a line per key. On a panel where 0 means "no such term" (KL), a
    key that is 0 at every step is named in a note instead, and a panel of only such keys
    holds the note alone: a flat line at 0 would read as a measured value."""
    from matplotlib.ticker import MaxNLocator

    drawn = [k for k in keys if not _never_computed(series, stem, k)]
    for key in drawn:
        steps, values = series[key]
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, ms=3, label=key)
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)
    zero = [k for k in keys if k not in drawn]
    if zero:
        note = "\n".join(f"{k}: 0 at every step" for k in zero)
        if not drawn:
            note += "\nnot computed by this run (no such term)"
        # Alone: in the middle of the empty panel; beside lines: in the lower left corner.
        x, y, ha, va = (
            (0.5, 0.5, "center", "center") if not drawn else (0.02, 0.04, "left", "bottom")
        )
        ax.text(x, y, note, transform=ax.transAxes, ha=ha, va=va, fontsize="small", color="0.35")
    if len(drawn) > 1 or (drawn and stem == "val_accuracy"):
        ax.legend(fontsize="small")


def _summary(plt: Any, series: Series, panels: list[Panel], path: Path, *, title: str) -> Path:
    """One page: the panels with data on a grid of up to 3 columns, titled with the run."""
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.6 * rows), squeeze=False)
    for ax, (stem, panel_title, ylabel, keys) in zip(axes.flat, panels):
        draw_panel(ax, series, stem, panel_title, ylabel, keys)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_run(
    run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Write ``summary.png`` and one PNG per panel that has data; return their paths, the
    summary first (raises DataError if no panel has data)."""
    try:
        import matplotlib
    except ImportError as err:
        msg = "rlcore plot needs matplotlib: pip install 'rlcore[plot]' (or pip install matplotlib)"
        raise RlcoreError(msg) from err
    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    run = Path(run_dir)
    series = load_metrics(run / "metrics.jsonl")
    out = Path(out_dir) if out_dir is not None else run / "plots"
    out.mkdir(parents=True, exist_ok=True)
    panels: list[Panel] = []  # (stem, title, y label, keys) of the panels with data
    for stem, title, ylabel, selectors in PANELS:
        keys = (
            _val_keys(series) if selectors == ("val/",) else [k for k in selectors if k in series]
        )
        if keys:
            panels.append((stem, title, ylabel, keys))
    if not panels:
        msg = f"{run / 'metrics.jsonl'} has none of the plotted metrics (reward, val, KL, ...)"
        raise DataError(msg)
    written = [_summary(plt, series, panels, out / SUMMARY_NAME, title=run.resolve().name)]
    for stem, title, ylabel, keys in panels:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        draw_panel(ax, series, stem, title, ylabel, keys)
        fig.tight_layout()
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    log.info("wrote %d plots to %s", len(written), out)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlcore.tracking.plotting RUN_DIR [--out DIR]``; the CLI's ``rlcore plot`` calls
    :func:`plot_run` directly."""
    import argparse

    parser = argparse.ArgumentParser(prog="rlcore plot", description="PNG curves of a run")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default RUN_DIR/plots)")
    args = parser.parse_args(argv)
    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
