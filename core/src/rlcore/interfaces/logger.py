"""Experiment trackers: :class:`BaseLogger` and the :class:`RunInfo` it is built with."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import attrs

if TYPE_CHECKING:
    from pathlib import Path


@attrs.frozen(kw_only=True)
class RunInfo:
    """What a logger knows of the run it records (driver-side only; never sent to workers).

    ``config`` is the resolved run config as plain TOML-able data (the hyper-parameters);
    ``start_step`` the last completed step when resuming (0 for a new run), so a logger can
    re-open the run it started before (``resuming``) instead of opening a second one.
    """

    run_dir: Path
    experiment_name: str
    total_steps: int | None = None
    start_step: int = 0
    log_freq: int = 1  # the console table every N steps ([trainer] log_freq)
    config: Mapping[str, Any] = attrs.field(factory=dict)
    stream: TextIO | None = None  # the console's stream; None: standard error

    @property
    def resuming(self) -> bool:
        return self.start_step > 0


class BaseLogger(abc.ABC):
    """An experiment tracker: where each step's metrics go (console, files, a service).

    Selected by ``[trainer] loggers = ["console", "jsonl", "wandb"]``; its options come from
    ``[trainer.logger_options.NAME]``. The driver builds every selected logger once, calls
    :meth:`log` after each step with one flat dict (``"critic/score/mean"`` -> float; ``None``
    for a value that was not finite), :meth:`log_files` with the run's plots at the end, and
    :meth:`close` always (also after an error). Each call is waited for at most ``[trainer]
    logger_timeout_s``: past it the run goes on and this logger's metrics are dropped (counted,
    one warning) until the late call returns; a call that raises ends this logger for the run
    (one warning), never the run (the run's own ``metrics.jsonl`` is the record). Before Ray
    starts, :meth:`check` may refuse a destination that cannot take the run. Example::

        class PrintLogger(BaseLogger):
            def log(self, metrics, step):
                print(step, metrics.get("critic/score/mean"))
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The logger's own options (``[trainer.logger_options.NAME]``)."""

    def __init__(self, run: RunInfo, config: BaseLogger.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyLogger(run)` works in tests and notebooks.
        self.run = run
        self.config = config if config is not None else type(self).Config()

    @classmethod
    def check(cls, run: RunInfo, config: Any, timeout_s: float) -> None:
        """Before Ray starts: raise an :class:`~rlcore.errors.RlcoreError` whose one-line
        message names the option to fix if this logger's destination cannot take the run (a
        server that does not answer within ``timeout_s``, a folder that cannot be written).
        ``config`` is the logger's ``Config``. The default checks nothing; the helpers are
        :func:`rlcore.tracking.bounds.check_server` and ``check_folder``."""

    @abc.abstractmethod
    def log(self, metrics: Mapping[str, float | int | str | None], step: int) -> None:
        """Record ``metrics`` for ``step`` (the number of completed training steps)."""

    @staticmethod
    def numbers(metrics: Mapping[str, Any]) -> dict[str, float | int]:
        """The numeric values of ``metrics`` (what a tracker can plot): no ``None`` (a value
        that was not finite), no strings, no booleans."""
        return {
            key: value
            for key, value in metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }

    def log_files(self, paths: Sequence[Path]) -> None:
        """Attach files the run made (its plots, at the end); most loggers ignore them."""

    def close(self) -> None:
        """Flush and end the run's record; called once, also when the run failed."""
