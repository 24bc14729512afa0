"""Each selected tracker's destination checked before Ray starts (one line if it cannot take
the run), bounded by ``trainer.logger_timeout_s``: the checks themselves are the loggers'
(:meth:`rlcore.interfaces.BaseLogger.check`, with :mod:`rlcore.tracking.bounds`' helpers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlcore.interfaces import BaseLogger, RunInfo

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.plugins import PluginRegistry

__all__ = ["check_loggers"]


def check_loggers(config: RunConfig, registry: PluginRegistry | None = None) -> None:
    """Every logger of ``[trainer] loggers`` checks its destination (one line if it cannot
    take the run), each within ``trainer.logger_timeout_s``; run before Ray starts."""
    from rlcore.plugins import default_registry

    registry = registry if registry is not None else default_registry(config.plugins.disabled)
    run = RunInfo(
        run_dir=Path(config.trainer.run_dir),
        experiment_name=config.trainer.experiment_name,
        total_steps=config.trainer.total_steps,
    )
    for name in config.trainer.loggers:
        cls: type[BaseLogger] = registry.resolve("logger", name, where="[trainer] loggers")
        options = config.trainer.logger_options.get(name)
        cls.check(
            run, options if options is not None else cls.Config(), config.trainer.logger_timeout_s
        )
