"""The micro-batch loop of ``forward_backward`` (gradient) and of ``compute_log_prob`` /
``compute_values`` (no gradient), around the engine's own forward: totals, loss scaling,
token-weighted metric means, zero-weight passes so every rank issues the same collectives.

:class:`MetricMeans` and :func:`token_weight` are its parts, for an engine whose framework
runs the loop itself (megatron's schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rlcore.engine.micro_batches import batch_totals, micro_batch_count, split_micro_batches
from rlcore.errors import EngineError
from rlcore.interfaces import (
    EngineSpec,
    LossFn,
    ModelOutputs,
)

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

__all__ = [
    "MetricMeans",
    "accumulate_gradients",
    "forward_micro_batches",
    "token_weight",
]


# What a micro-batch weighs in the metric means when it has no valid response token (only
# driver padding rows): nothing, without a division by zero when every micro-batch is such.
_EMPTY_WEIGHT = 1e-9


def token_weight(micro_batch: DataProto) -> float:
    """A micro-batch's weight in the metric means: its valid response tokens."""
    return float(micro_batch.batch["response_mask"].sum().item()) or _EMPTY_WEIGHT


class MetricMeans:
    """Means of micro-batch metrics weighted by :func:`token_weight` (what ``forward_backward``
    returns): ``sum_i w_i * m_i / sum_i w_i`` per key, in float64."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weight = 0.0

    def add(self, metrics: Mapping[str, float], weight: float) -> None:
        for key, value in metrics.items():
            self._sums[key] = self._sums.get(key, 0.0) + float(value) * weight
        self._weight += weight

    def result(self) -> dict[str, float]:
        """The means; empty when nothing was added (a pipeline stage without the loss)."""
        return {key: value / self._weight for key, value in self._sums.items()}


def _to_device(mb: DataProto, device: torch.device | None) -> DataProto:
    """A shallow copy of ``mb`` with its tensors on ``device`` (the caller's batch untouched)."""
    if device is None or device.type == "cpu":
        return mb
    from rlcore.protocol import DataProto

    return DataProto(
        batch=dict(mb.batch), non_tensor_batch=mb.non_tensor_batch, meta_info=mb.meta_info
    ).to(device)


def _plan(
    batch: DataProto,
    spec: EngineSpec,
    device: torch.device | None,
    *,
    packed: bool,
    share_prompts: bool,
    match_ranks: bool,
) -> tuple[list[DataProto], int]:
    """This rank's micro-batches and how many passes to run (the largest count over ranks
    with ``match_ranks``, else as many as there are micro-batches)."""
    if len(batch) == 0:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        msg = f"[{spec.role}] rank {rank} got an empty batch"
        raise EngineError(msg)
    mbs = split_micro_batches(
        batch,
        micro_batch_size=spec.micro_batch_size,
        max_tokens=spec.max_tokens_per_micro_batch,
        packed=packed,
        share_prompts=share_prompts,
    )
    return mbs, micro_batch_count(len(mbs), device) if match_ranks else len(mbs)


def _zero_loss(outputs: ModelOutputs) -> torch.Tensor:
    """A loss of value 0 that still runs the backward's collectives (a zero-weight pass)."""
    tensor = outputs.values if outputs.values is not None else outputs.log_probs
    if tensor is None:
        msg = "a forward returned ModelOutputs with neither log_probs nor values"
        raise EngineError(msg)
    return tensor.sum() * 0.0


def accumulate_gradients(
    batch: DataProto,
    loss_fn: LossFn,
    forward: Callable[[DataProto], ModelOutputs],
    *,
    spec: EngineSpec,
    device: torch.device | None = None,
    loss_scale: float = 1.0,
    packed: bool = False,
    share_prompts: bool = False,
    match_ranks: bool = False,
) -> dict[str, float]:
    """The body of :meth:`~rlcore.interfaces.BaseEngine.forward_backward` around ``forward``.

    ``forward(micro_batch)`` is the engine's own: one micro-batch (tensors on ``device``)
    through the model, with gradient, returning its (b, R) :class:`ModelOutputs`. Around it:

    1. :func:`batch_totals` of the whole ``batch`` (collective over all ranks);
    2. :func:`split_micro_batches` by ``spec.micro_batch_size`` or
       ``spec.max_tokens_per_micro_batch`` (``packed``/``share_prompts``: how the engine
       counts a token budget); an empty ``batch`` is an :class:`~rlcore.errors.EngineError`;
    3. per micro-batch: ``loss, metrics = loss_fn(outputs, micro_batch, totals)``, then
       ``(loss * loss_scale).backward()`` (``loss_scale``: e.g. the data-parallel size, for a
       wrapper that averages gradients over ranks while the loss is normalised globally);
    4. ``match_ranks``: a rank with fewer micro-batches than another (token budgets split
       differently per rank) runs zero-weight passes on its first row until the counts
       agree, so every rank issues the same collectives (FSDP's all-gathers);

    and returns the metrics averaged over micro-batches weighted by their valid response
    tokens (:class:`MetricMeans`; a micro-batch of padding rows weighs nothing). Rows the
    trainer left out for a zero advantage never reach the engine; the loss still divides by
    the totals of the whole mini-batch (:mod:`rlcore.roles.levers`).
    """
    totals = batch_totals(batch, device)
    mbs, passes = _plan(
        batch, spec, device, packed=packed, share_prompts=share_prompts, match_ranks=match_ranks
    )
    means = MetricMeans()
    for i in range(passes):
        real = i < len(mbs)
        mb = _to_device(mbs[i] if real else batch.slice(0, 1), device)
        outputs = forward(mb)
        if real:
            loss, metrics = loss_fn(outputs, mb, totals)
            means.add(metrics, token_weight(mb))
        else:
            loss = _zero_loss(outputs)
        if loss_scale != 1.0:  # x 1.0 is exact either way; skipping it keeps the graph small
            loss = loss * loss_scale
        loss.backward()
    return means.result()


def forward_micro_batches(
    batch: DataProto,
    forward: Callable[[DataProto], ModelOutputs],
    *,
    spec: EngineSpec,
    device: torch.device | None = None,
    packed: bool = False,
    share_prompts: bool = False,
    match_ranks: bool = False,
) -> ModelOutputs:
    """``forward`` over ``batch``'s micro-batches without gradient; outputs joined, on CPU.

    The inference twin of :func:`accumulate_gradients` (same split, same zero-weight passes
    with ``match_ranks``): each (B, R) field of the result is the concatenation over
    micro-batches of the fields every micro-batch's ``forward`` filled (None otherwise).
    """
    import torch

    mbs, passes = _plan(
        batch, spec, device, packed=packed, share_prompts=share_prompts, match_ranks=match_ranks
    )
    outs = []
    with torch.no_grad():
        for i in range(passes):
            out = forward(_to_device(mbs[i] if i < len(mbs) else batch.slice(0, 1), device))
            if i < len(mbs):
                outs.append(out)

    def joined(field: str) -> torch.Tensor | None:
        parts = [getattr(o, field) for o in outs]
        if any(part is None for part in parts):
            return None
        return torch.cat(parts).cpu()

    return ModelOutputs(
        log_probs=joined("log_probs"), entropy=joined("entropy"), values=joined("values")
    )
