"""Checkpoints: the manager that saves and finds them, their layout, safe loading, resume checks
and export.

- :mod:`~rlcore.checkpoint.layout` — the names of a checkpoint directory's parts;
- :mod:`~rlcore.checkpoint.manager` — save, find, prune; driver and worker state; RNG state;
- :mod:`~rlcore.checkpoint.safe_load` — manifests, verification and the pickle-free loaders
  (nothing in a checkpoint runs code);
- :mod:`~rlcore.checkpoint.safetensors_header` — a safetensors file's header, read without
  loading a tensor (verification and the preflight checks both use it);
- :mod:`~rlcore.checkpoint.resume_check` — resume only what the checkpoint was trained as;
- :mod:`~rlcore.checkpoint.export` — ``rlcore export``: a trained actor as a Hugging Face folder.

The manager's names are importable from here, as before (``from rlcore.checkpoint import
CheckpointManager``).
"""

from __future__ import annotations

# The manager's own ``__all__`` is the one list of these names: a star import keeps the two from
# drifting apart.
from rlcore.checkpoint.manager import *  # noqa: F403
from rlcore.checkpoint.manager import __all__ as __all__
