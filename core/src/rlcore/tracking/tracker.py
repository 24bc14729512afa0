"""Where a run's metrics go: every logger selected in ``[trainer] loggers``.

    tracker = Tracker(run_dir, ["console", "jsonl", "wandb"], total_steps=200)
    for step in ...:
        tracker.log(metrics, step)          # one flat dict of floats per step
    tracker.log_files(plot_paths)           # at the end: the run's plots
    tracker.close()

Each name is a logger plugin (kind ``logger``): the core's ``console``, ``jsonl`` and
``tensorboard`` (:mod:`rlcore.tracking.loggers`) or an installed one (``rlcore-wandb``,
``rlcore-mlflow``). A logger that fails while the run goes on (a tracking service that is
down) is warned about once and skipped from then on; one that does not answer within
``timeout_s`` (``[trainer] logger_timeout_s``) is warned about once and its calls are dropped,
counted in ``tracker/<name>/dropped``, until the late one returns
(:mod:`rlcore.tracking.bounds`). The run's ``metrics.jsonl`` stays the record. Values reach
every logger as JSON-safe scalars (NaN and inf as ``None``).
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
from rlcore.tracking.bounds import DEFAULT_TIMEOUT_S, TIMEOUT_KEY, BoundedCall
from rlcore.tracking.loggers import LOGGERS, METRICS_FILE, ConsoleLogger, format_table, scalar

log = logging.getLogger(__name__)

__all__ = ["LOGGERS", "METRICS_FILE", "Tracker", "format_table"]


class _Entry:
    """One logger and its bound: the call it has not finished, and what it has missed."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        self.logger: BaseLogger | None = None  # None: it did not start within the bound
        self.late: BoundedCall | None = None  # a call still running past the bound
        self.dropped = 0  # calls not made (or not waited for) because of the bound

    def call(self, what: str, fn: Any) -> tuple[bool, Any]:
        """``(True, fn())`` within the bound, else ``(False, None)``: dropped (counted, warned
        once). The call's own exception propagates."""
        if self.late is not None and self.late.running:
            self.dropped += 1
            return False, None
        self.late = None
        call = BoundedCall(fn, f"rlcore-logger-{self.name}")
        if call.wait(self.timeout_s):
            return True, call.result()
        self.late = call
        self.dropped += 1
        if self.dropped == 1:
            log.warning(
                "logger %r did not answer %s within %g s (%s); the run goes on and its metrics "
                "are dropped (counted in tracker/%s/dropped) until it answers",
                self.name,
                what,
                self.timeout_s,
                TIMEOUT_KEY,
                self.name,
            )
        return False, None


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
        timeout_s: float = DEFAULT_TIMEOUT_S,
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
        self._entries: list[_Entry] = []
        try:
            for item in loggers:
                if isinstance(item, BaseLogger):
                    entry = _Entry(type(item).__name__, timeout_s)
                    entry.logger = item
                    self._entries.append(entry)
                    continue
                cls = registry.resolve("logger", item, where="[trainer] loggers")
                entry = _Entry(item, timeout_s)
                self._entries.append(entry)
                try:
                    started, built = entry.call(
                        "its start", lambda c=cls, i=item: c(self.run, options.get(i))
                    )
                except Exception as err:  # a tracker's own start-up error, named
                    msg = f"logger {item!r} ([trainer] loggers) could not start: {err}"
                    raise PluginError(msg) from err
                entry.logger = built if started else None
        except BaseException:
            self.close()
            raise
        log.info("run directory: %s", self.run_dir.resolve())

    @property
    def loggers(self) -> list[BaseLogger]:
        return [e.logger for e in self._entries if e.logger is not None]

    def dropped(self) -> dict[str, int]:
        """``tracker/<name>/dropped`` of each logger that missed calls past its bound."""
        return {f"tracker/{e.name}/dropped": e.dropped for e in self._entries if e.dropped}

    def _each(self, what: str, call: Any) -> None:
        for entry in list(self._entries):
            logger = entry.logger
            if logger is None:  # never started within its bound
                entry.dropped += 1
                continue
            try:
                entry.call(what, lambda lg=logger: call(lg))
            except Exception as err:  # a tracking service down must not end the run
                log.warning(
                    "logger %r failed in %s and is skipped from now on: %s", entry.name, what, err
                )
                self._entries.remove(entry)
                self._close_one(entry)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` for ``step`` (the number of completed training steps)."""
        row = {key: scalar(value) for key, value in metrics.items()} | self.dropped()
        self._each("log", lambda logger: logger.log(row, step))

    def log_files(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        """Attach files the run made (its plots) to every logger that keeps files."""
        files = [Path(p) for p in paths]
        if files:
            self._each("log_files", lambda logger: logger.log_files(files))

    @staticmethod
    def _close_one(entry: _Entry) -> None:
        logger = entry.logger
        if logger is None:
            return
        try:
            entry.call("close", logger.close)
        except Exception as err:  # closing one must not keep the others open
            log.warning("logger %r failed to close: %s", entry.name, err)

    def close(self) -> None:
        entries, self._entries = self._entries, []
        for entry in entries:
            self._close_one(entry)
            if entry.dropped:
                log.warning(
                    "logger %r missed %d call(s) (no answer within %g s, %s); the run's "
                    "metrics.jsonl has every step",
                    entry.name,
                    entry.dropped,
                    entry.timeout_s,
                    TIMEOUT_KEY,
                )

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
