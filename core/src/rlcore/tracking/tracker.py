"""Where a run's metrics go: every logger selected in ``[trainer] loggers``.

    tracker = Tracker(run_dir, ["console", "jsonl", "wandb"], total_steps=200)
    for step in ...:
        tracker.log(metrics, step)          # one flat dict of floats per step
    tracker.log_files(plot_paths)           # at the end: the run's plots
    tracker.close()

Each name is a logger plugin (kind ``logger``): the core's ``console``, ``jsonl`` and
``tensorboard`` (:mod:`rlcore.tracking.loggers`) or an installed one (``rlcore-wandb``,
``rlcore-mlflow``). A logger that fails while the run goes on (a tracking service that is
down) is warned about once and skipped from then on; the run's ``metrics.jsonl`` stays the
record. Values reach every logger as JSON-safe scalars (NaN and inf as ``None``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rlcore.errors import PluginError
from rlcore.interfaces import BaseLogger, RunInfo
from rlcore.plugins import PluginRegistry, default_registry
from rlcore.tracking.loggers import LOGGERS, METRICS_FILE, ConsoleLogger, format_table, scalar

log = logging.getLogger(__name__)

__all__ = ["LOGGERS", "METRICS_FILE", "Tracker", "format_table"]


class Tracker:
    """Sends each step's metrics to the selected loggers.

    ``loggers``: names of logger plugins (or built :class:`BaseLogger` instances);
    ``logger_options``: each name's ``Config`` (``[trainer.logger_options.NAME]``; missing:
    the logger's defaults). ``start_step``: the last completed step when resuming, so the bar
    and ETA start there and a tracking service re-opens the same run. ``config``: the
    resolved run config as plain data, logged as the run's hyper-parameters. ``stream`` and
    ``progress_bar`` set the console's output (tests, notebooks).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        loggers: Sequence[str | BaseLogger] = LOGGERS,
        *,
        total_steps: int | None = None,
        console_every: int = 10,
        start_step: int = 0,
        stream: TextIO | None = None,
        progress_bar: bool | None = None,
        experiment_name: str = "rlcore",
        config: Mapping[str, Any] | None = None,
        logger_options: Mapping[str, Any] | None = None,
        registry: PluginRegistry | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run = RunInfo(
            run_dir=self.run_dir,
            experiment_name=experiment_name,
            total_steps=total_steps,
            start_step=start_step,
            log_freq=console_every,
            config=dict(config or {}),
            stream=stream,
        )
        options = dict(logger_options or {})
        if progress_bar is not None and "console" not in options:
            options["console"] = ConsoleLogger.Config(progress_bar=progress_bar)
        registry = registry if registry is not None else default_registry()
        self._loggers: list[tuple[str, BaseLogger]] = []
        try:
            for item in loggers:
                if isinstance(item, BaseLogger):
                    self._loggers.append((type(item).__name__, item))
                    continue
                cls = registry.resolve("logger", item, where="[trainer] loggers")
                try:
                    self._loggers.append((item, cls(self.run, options.get(item))))
                except Exception as err:  # a tracker's own start-up error, named
                    msg = f"logger {item!r} ([trainer] loggers) could not start: {err}"
                    raise PluginError(msg) from err
        except BaseException:
            self.close()
            raise
        log.info("run directory: %s", self.run_dir.resolve())

    @property
    def loggers(self) -> list[BaseLogger]:
        return [logger for _, logger in self._loggers]

    def _each(self, what: str, call: Any) -> None:
        for entry in list(self._loggers):
            name, logger = entry
            try:
                call(logger)
            except Exception as err:  # a tracking service down must not end the run
                log.warning(
                    "logger %r failed in %s and is skipped from now on: %s", name, what, err
                )
                self._loggers.remove(entry)
                self._close_one(name, logger)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` for ``step`` (the number of completed training steps)."""
        row = {key: scalar(value) for key, value in metrics.items()}
        self._each("log", lambda logger: logger.log(row, step))

    def log_files(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        """Attach files the run made (its plots) to every logger that keeps files."""
        files = [Path(p) for p in paths]
        if files:
            self._each("log_files", lambda logger: logger.log_files(files))

    @staticmethod
    def _close_one(name: str, logger: BaseLogger) -> None:
        try:
            logger.close()
        except Exception as err:  # closing one must not keep the others open
            log.warning("logger %r failed to close: %s", name, err)

    def close(self) -> None:
        loggers, self._loggers = self._loggers, []
        for name, logger in loggers:
            self._close_one(name, logger)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
