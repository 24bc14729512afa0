"""Update-time levers that cut compute and leave the update unchanged (issue 16).

Both wrap the algorithm's loss function on the worker, so they work with any engine that
honours the :class:`~rlcore.interfaces.BaseEngine` contract:

- **Old log-probs from the training forward** (:func:`old_log_probs_from_forward`). When the
  update is on-policy (one epoch, one mini-batch per step) and nothing on the driver reads
  ``old_log_probs`` (no KL in the reward), the policy that would score them in a separate
  pass is the one the training forward runs: ``old = log_probs.detach()`` gives the same
  ratio (1) and the same gradient, without the pass (TRL does the same).
- **Zero-advantage rows out of the backward pass** (:func:`drop_zero_advantage_rows`). A
  GRPO/RLOO group whose rewards are all equal has advantage 0 on every row; when the loss has
  no term besides advantage-weighted ones (no KL loss, no entropy bonus) those rows add
  nothing to the gradient. They are left out of the forward/backward, and the loss still
  divides by the whole mini-batch's :class:`~rlcore.interfaces.BatchTotals`, so the
  gradient is exactly that of the full mini-batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.engine import batch_totals

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import BatchTotals, LossFn, ModelOutputs
    from rlcore.protocol import DataProto
    from rlcore.roles.mismatch import MismatchTally

__all__ = [
    "drop_zero_advantage_rows",
    "old_log_probs_from_forward",
    "trained_rows",
    "with_totals",
]


def old_log_probs_from_forward(loss_fn: LossFn, tally: MismatchTally | None = None) -> LossFn:
    """``loss_fn`` that, when a micro-batch has no ``old_log_probs``, uses the forward's.

    Only correct on-policy: the caller checks that the data is used for one optimizer step.
    ``tally``: where the micro-batch carries ``rollout_log_probs``, their distance to these
    old log-probs is added to it (:mod:`rlcore.roles.mismatch`).
    """

    def loss(
        outputs: ModelOutputs, micro_batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        from rlcore.protocol import DataProto

        if "old_log_probs" in micro_batch.batch:
            return loss_fn(outputs, micro_batch, totals)
        if outputs.log_probs is None:
            msg = "old log-probs from the training forward need outputs.log_probs"
            raise RuntimeError(msg)
        tensors = dict(micro_batch.batch)
        tensors["old_log_probs"] = outputs.log_probs.detach()  # (b, R): ratio 1, same gradient
        if tally is not None and "rollout_log_probs" in tensors:
            tally.add(
                tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"]
            )
        with_old = DataProto(
            batch=tensors,
            non_tensor_batch=micro_batch.non_tensor_batch,
            meta_info=micro_batch.meta_info,
        )
        return loss_fn(outputs, with_old, totals)

    return loss


def with_totals(loss_fn: LossFn, totals: BatchTotals) -> LossFn:
    """``loss_fn`` that divides by ``totals`` whatever the engine computed for its rows."""

    def loss(
        outputs: ModelOutputs, micro_batch: DataProto, _engine_totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return loss_fn(outputs, micro_batch, totals)

    return loss


def drop_zero_advantage_rows(
    mini_batch: DataProto, device: torch.device | None = None
) -> tuple[DataProto, BatchTotals]:
    """The rows of ``mini_batch`` with a non-zero advantage on a valid token, and the totals
    of the whole ``mini_batch`` (over all ranks: collective, like :func:`batch_totals`).

    At least one row is kept so that every rank runs the engine's collectives; a kept
    zero-advantage row adds a zero gradient.
    """
    totals = batch_totals(mini_batch, device)
    active = trained_rows(mini_batch)
    if not bool(active.any()):
        active[0] = True
    if bool(active.all()):
        return mini_batch, totals
    return mini_batch.select_idxs(active.cpu().numpy()), totals


def trained_rows(batch: DataProto) -> torch.Tensor:
    """(b,) bool: the rows with a non-zero advantage on a valid token, those
    :func:`drop_zero_advantage_rows` keeps (the driver's layout balances them over ranks)."""
    import torch

    advantages = batch.batch["advantages"]  # (b, R)
    mask = batch.batch["response_mask"].to(torch.bool)
    return ((advantages != 0) & mask).any(dim=-1)
