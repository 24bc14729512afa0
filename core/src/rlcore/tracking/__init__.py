"""Where a run's numbers go and how they are read back.

- :mod:`~rlcore.tracking.metrics` — per-step metrics with verl's names, phase timers, throughput;
- :mod:`~rlcore.tracking.tracker` — the :class:`Tracker`: every logger in ``[trainer] loggers``;
- :mod:`~rlcore.tracking.bounds` — each logger's destination checked before Ray, each call bounded;
- :mod:`~rlcore.tracking.loggers` — the core's loggers: console, ``metrics.jsonl``, TensorBoard;
- :mod:`~rlcore.tracking.plotting` — ``rlcore plot RUN_DIR``: PNG curves from ``metrics.jsonl``.
"""

from __future__ import annotations

from rlcore.tracking.tracker import LOGGERS, METRICS_FILE, Tracker, format_table

__all__ = ["LOGGERS", "METRICS_FILE", "Tracker", "format_table"]
