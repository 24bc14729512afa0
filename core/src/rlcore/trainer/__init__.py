"""The trainer: generic role workers, the driver loop and the run around it.

- :mod:`rlcore.trainer.run` — :func:`run_training`, what ``rlcore train`` calls;
- :mod:`rlcore.trainer.specs` — one spec per role, built on the driver;
- :mod:`rlcore.trainer.builder` — algorithm, reward manager and placed workers;
- :mod:`rlcore.trainer.roles` — the policy and critic workers;
- :mod:`rlcore.trainer.layout` — rows of the update passes, padded to whole rows per rank;
- :mod:`rlcore.trainer.fit` — the driver loop.

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
