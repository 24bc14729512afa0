"""Masked reductions over response tokens.

``mask`` is the ``response_mask`` (B, R), 0/1 in any dtype; it is cast to the values' dtype.
Statistics that feed a division (mean, variance) are accumulated in float64: a float32
zero-variance group or batch must whiten to exactly 0, not to rounding noise divided by eps.
"""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (over all elements, or along ``dim``)."""
    masked = values * mask.to(values.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 where nothing is valid (no NaN).

    verl divides by ``mask.sum() + 1e-8``; we divide by ``max(mask.sum(), 1)``, which is
    exact for any non-empty mask and gives the same 0 for an empty one.
    """
    mask = mask.to(values.dtype)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def _mean_var(
    values: torch.Tensor, mask: torch.Tensor, unbiased: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    # float64 scalars; two passes (mean, then squared deviations) for accuracy.
    v = values.to(torch.float64)
    m = mask.to(torch.float64)
    count = m.sum()
    mean = (v * m).sum() / count.clamp(min=1)
    denom = count - 1 if unbiased else count
    if denom <= 0:
        return mean, torch.zeros((), dtype=torch.float64, device=values.device)
    return mean, (((v - mean) ** 2) * m).sum() / denom


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance over the valid elements (float64 scalar), Bessel-corrected by default.

    With fewer than two valid elements the unbiased variance is undefined; we return 0
    (verl raises) so that a batch of one valid token whitens to 0 instead of crashing a run.
    """
    return _mean_var(values, mask, unbiased)[1]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` over the valid elements, as verl's ``masked_whiten``.

    Mean and unbiased variance are taken over all valid elements of the batch. The result is
    NOT re-masked here (callers multiply by ``mask``); it has ``values``' dtype.
    """
    mean, var = _mean_var(values, mask, unbiased=True)
    return ((values.to(torch.float64) - mean) * torch.rsqrt(var + 1e-8)).to(values.dtype)
