"""What every training engine needs besides its model, one module per job.

A contract-only engine (:class:`rlcore.interfaces.BaseEngine`) builds its model and optimizer,
runs one micro-batch forward, saves state and exports; the rest comes from here, so that every
engine normalises, schedules and skips the same way:

- :mod:`rlcore.engine.device` — :func:`init_device` (this process's device, the default
  process group, seed and threads), :func:`dtype_from_name`, :func:`local_device_index`,
  :func:`process_group_backend` (nccl on CUDA, gloo otherwise);
- :mod:`rlcore.engine.loop` — :func:`accumulate_gradients`, the micro-batch loop of
  ``forward_backward`` around the engine's own forward (totals, loss scaling, token-weighted
  metric means, zero-weight passes); :func:`forward_micro_batches`, the same loop without
  gradient; :class:`MetricMeans` and :func:`token_weight`, its parts;
- :mod:`rlcore.engine.micro_batches` — :func:`split_micro_batches` (by row count or a token
  budget), :func:`prompt_group_starts`, :func:`micro_batch_count`, :func:`batch_totals`
  (the denominators every loss divides by, over all ranks);
- :mod:`rlcore.engine.optimizer` — :func:`learning_rate` (the LR schedule; the worker passes
  ``lr`` to ``optimizer_step`` and logs it), :class:`OptimizerGuard` (grad norm, clip, skip a
  non-finite step, count steps and skips), :func:`clip_and_step`;
- :mod:`rlcore.engine.log_probs` — :func:`log_probs_from_logits`,
  :func:`entropy_from_logits`: float32, chunked over tokens;
- :mod:`rlcore.engine.rollout_layout` — :func:`position_ids_from_mask`, the positions of
  left-padded prompts, and :func:`rollout_tensors`, the output layout of every rollout's
  ``generate``;
- :mod:`rlcore.engine.export` — :func:`copy_tokenizer_files`.

Every name is importable from ``rlcore.engine`` too. torch is imported by the functions that
need it, so the worker can import the schedule without pulling in anything else.
(``rlcore.engine_utils``, the one module this package replaces, still re-exports these names
for plugins written against it.)
"""

from __future__ import annotations

from rlcore.engine.device import (
    dtype_from_name,
    init_device,
    local_device_index,
    process_group_backend,
)
from rlcore.engine.export import TOKENIZER_FILES, copy_tokenizer_files
from rlcore.engine.log_probs import (
    LOG_PROB_CHUNK_TOKENS,
    entropy_from_logits,
    log_probs_from_logits,
)
from rlcore.engine.loop import (
    MetricMeans,
    accumulate_gradients,
    forward_micro_batches,
    token_weight,
)
from rlcore.engine.micro_batches import (
    batch_totals,
    micro_batch_count,
    prompt_group_starts,
    split_micro_batches,
)
from rlcore.engine.optimizer import (
    GuardedSteps,
    OptimizerGuard,
    clip_and_step,
    clip_grad_norm,
    learning_rate,
    lr_multiplier,
    set_lr,
)
from rlcore.engine.rollout_layout import position_ids_from_mask, rollout_tensors

__all__ = [
    "LOG_PROB_CHUNK_TOKENS",
    "TOKENIZER_FILES",
    "GuardedSteps",
    "MetricMeans",
    "OptimizerGuard",
    "accumulate_gradients",
    "batch_totals",
    "clip_and_step",
    "clip_grad_norm",
    "copy_tokenizer_files",
    "dtype_from_name",
    "entropy_from_logits",
    "forward_micro_batches",
    "init_device",
    "learning_rate",
    "local_device_index",
    "log_probs_from_logits",
    "lr_multiplier",
    "micro_batch_count",
    "position_ids_from_mask",
    "process_group_backend",
    "prompt_group_starts",
    "rollout_tensors",
    "set_lr",
    "split_micro_batches",
    "token_weight",
]
