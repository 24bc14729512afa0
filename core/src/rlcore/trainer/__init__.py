"""The driver: the loop and the run around it, all in the ``rlcore train`` process.

Nothing here runs inside a Ray worker; what does is :mod:`rlcore.roles`.

- :mod:`rlcore.trainer.run` — :func:`run_training`, what ``rlcore train`` calls;
- :mod:`rlcore.trainer.specs` — one spec per role, built from the run config;
- :mod:`rlcore.trainer.builder` — algorithm, reward manager and placed workers;
- :mod:`rlcore.trainer.plan` — the loop's plan (steps, validation, saves);
- :mod:`rlcore.trainer.fit` — the driver loop; :mod:`rlcore.trainer.context` its step context;
- :mod:`rlcore.trainer.state` — what a resume restores on the driver;
- :mod:`rlcore.trainer.async_queue`, :mod:`rlcore.trainer.placement` — generation ahead of
  training on the rollout's own pool;
- :mod:`rlcore.trainer.layout` — rows of the update passes, padded to whole rows per rank;
- :mod:`rlcore.trainer.divergence`, :mod:`rlcore.trainer.plugin_checks`,
  :mod:`rlcore.trainer.runlock` — the run's guards.

Importing this package is cheap: :func:`run_training` is looked up on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlcore.trainer.run import FINAL_EXPORT_DIR, prepare_run_dir, run_training

__all__ = ["FINAL_EXPORT_DIR", "prepare_run_dir", "run_training"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rlcore.trainer import run

        return getattr(run, name)
    msg = f"module 'rlcore.trainer' has no attribute {name!r}"
    raise AttributeError(msg)
