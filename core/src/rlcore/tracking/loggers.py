"""The core's loggers: a progress bar and tables on the console, ``metrics.jsonl``, TensorBoard.

Each is a :class:`~rlcore.interfaces.BaseLogger` registered by :mod:`rlcore.builtin`,
selected by name in ``[trainer] loggers`` like a third-party tracker (``wandb``, ``mlflow``).

``metrics.jsonl`` in the run directory gets one line per ``log`` call,
``{"step": 3, "critic/score/mean": 0.41, ...}``, appended and flushed at once so a crashed or
resumed run keeps what it had (readers take the last value of a key for a step).
``rlcore plot RUN_DIR`` reads that file. TensorBoard event files go to ``run_dir/tensorboard``
when the ``tensorboard`` package is installed; otherwise a note says how to get them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import attrs

from rlcore.interfaces import BaseLogger, RunInfo, key

log = logging.getLogger(__name__)

__all__ = [
    "LOGGERS",
    "METRICS_FILE",
    "ConsoleLogger",
    "JsonlLogger",
    "TensorBoardLogger",
    "format_table",
    "scalar",
]

# The core's own logger names (more come from plugins: rlcore-wandb, rlcore-mlflow).
LOGGERS = ("console", "jsonl", "tensorboard")
METRICS_FILE = "metrics.jsonl"
REWARD_KEY = "critic/score/mean"

# (column title, metric key) for the console table; a column shows only when its key is logged.
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reward", REWARD_KEY),
    ("pg_loss", "actor/pg_loss"),
    ("kl", "actor/ppo_kl"),
    ("kl_loss", "actor/kl_loss"),
    ("entropy", "actor/entropy"),
    ("grad_norm", "actor/grad_norm"),
    ("vf_loss", "critic/vf_loss"),
    ("resp_len", "response_length/mean"),
    ("clip", "response_length/clip_ratio"),
    ("step_s", "timing_s/step"),
    ("tok/s", "perf/tokens_per_s"),
    ("rss_GB", "perf/peak_rss_gb/actor"),
    ("mfu", "perf/mfu/update"),
)


def scalar(value: Any) -> Any:
    """A JSON-safe scalar: tensors/numpy -> Python numbers, NaN/inf -> None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def _fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.1f}"
    return f"{value:.2e}"


def _fmt_duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_table(
    step: int,
    metrics: Mapping[str, Any],
    total_steps: int | None = None,
    eta_s: float | None = None,
) -> str:
    """Two aligned lines (titles, values) of the key metrics, validation scores included."""
    cols: list[tuple[str, str]] = [
        ("step", f"{step}" if total_steps is None else f"{step}/{total_steps}")
    ]
    if eta_s is not None:
        cols.append(("eta", _fmt_duration(eta_s)))
    for title, metric in TABLE_COLUMNS:
        value = metrics.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool):
            cols.append((title, _fmt(float(value))))
    for metric in sorted(metrics):
        value = metrics[metric]
        if metric.startswith("val/") and isinstance(value, int | float):
            cols.append((metric, _fmt(float(value))))
    widths = [max(len(title), len(value)) for title, value in cols]
    head = "  ".join(title.rjust(w) for (title, _), w in zip(cols, widths))
    body = "  ".join(value.rjust(w) for (_, value), w in zip(cols, widths))
    return f"{head}\n{body}"


class ConsoleLogger(BaseLogger):
    """A tqdm bar with step, reward and ETA on standard error (only when it is a terminal,
    unless ``progress_bar`` says otherwise), plus a table every ``[trainer] log_freq`` steps
    and on every step with validation scores; in a log file the tables alone (with an
    ``eta`` column) keep it readable."""

    @attrs.frozen(kw_only=True)
    class Config(BaseLogger.Config):
        progress_bar: bool | None = key(
            None, "Show a progress bar; unset: only when stderr is a terminal."
        )  # None: only on a terminal

    config: ConsoleLogger.Config

    def __init__(self, run: RunInfo, config: ConsoleLogger.Config | None = None) -> None:
        super().__init__(run, config)
        self._stream: TextIO = run.stream if run.stream is not None else sys.stderr
        self._every = max(1, run.log_freq)
        self._bar: Any = None
        self._last_reward: float | None = None
        self._t0 = time.perf_counter()
        self._write(f"rlcore: run directory {run.run_dir.resolve()}")
        progress_bar = self.config.progress_bar
        if progress_bar is None:
            progress_bar = bool(getattr(self._stream, "isatty", lambda: False)())
        if progress_bar:
            from tqdm import tqdm

            self._bar = tqdm(
                total=run.total_steps,
                initial=run.start_step,
                desc="train",
                unit="step",
                file=self._stream,
                dynamic_ncols=True,
                mininterval=0.5,
                bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}",
            )

    def _write(self, text: str) -> None:
        from tqdm import tqdm

        tqdm.write(text, file=self._stream)

    def _eta(self, step: int) -> float | None:
        done = step - self.run.start_step
        if self.run.total_steps is None or done <= 0:
            return None
        return (time.perf_counter() - self._t0) / done * max(self.run.total_steps - step, 0)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._bar is not None:
            reward = metrics.get(REWARD_KEY)
            if isinstance(reward, float):
                self._last_reward = reward
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            if self._last_reward is not None:
                self._bar.set_postfix({"reward": f"{self._last_reward:.3f}"}, refresh=False)
            self._bar.refresh()
        has_val = any(metric.startswith("val/") for metric in metrics)
        if has_val or step % self._every == 0:
            # The bar already shows the ETA; a log file gets it in the table instead.
            eta = None if self._bar is not None else self._eta(step)
            self._write(format_table(step, metrics, self.run.total_steps, eta))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class JsonlLogger(BaseLogger):
    """``run_dir/metrics.jsonl``: one JSON object per step, appended and flushed at once."""

    def __init__(self, run: RunInfo, config: BaseLogger.Config | None = None) -> None:
        super().__init__(run, config)
        self._file: TextIO | None = (run.run_dir / METRICS_FILE).open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"step": step, **metrics}) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardLogger(BaseLogger):
    """Event files in ``run_dir/tensorboard``; skipped with a note without the package."""

    def __init__(self, run: RunInfo, config: BaseLogger.Config | None = None) -> None:
        super().__init__(run, config)
        self._writer: Any = None
        if importlib.util.find_spec("tensorboard") is None:
            log.info("TensorBoard logging skipped: pip install tensorboard to enable it")
        else:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run.run_dir / "tensorboard"))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._writer is None:
            return
        for metric, value in self.numbers(metrics).items():
            self._writer.add_scalar(metric, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
