"""Masked reductions over response tokens.

``mask`` is the ``response_mask`` (B, R), 0/1 in any dtype. Masks *select* (``torch.where``),
never multiply: ``NaN * 0`` is NaN, so a NaN or inf at a padded position (a log-prob of a pad
token, an overflowed ratio there) would poison the whole loss. Statistics are computed in the
values' dtype (torch sums pairwise, accurate to a few ulps; a float64 accumulator costs 30x
more at 4096 x 1024), with one correction pass on the mean.
"""

from __future__ import annotations

import torch

__all__ = ["apply_mask", "masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def apply_mask(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is nonzero, exactly 0 elsewhere (whatever is there: NaN too)."""
    return torch.where(mask != 0, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (over all elements, or along ``dim``)."""
    masked = apply_mask(values, mask)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 where nothing is valid (no NaN).

    verl divides by ``mask.sum() + 1e-8``; we divide by ``max(mask.sum(), 1)``, which is
    exact for any non-empty mask and gives the same 0 for an empty one.
    """
    valid = (mask != 0).to(values.dtype)
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def _mean_var(
    values: torch.Tensor, mask: torch.Tensor, unbiased: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked mean and variance, scalars in the values' dtype."""
    count = (mask != 0).sum().to(values.dtype)
    n = count.clamp(min=1)
    mean = masked_sum(values, mask) / n
    # One correction pass: for a batch of equal values the first mean may be off by an ulp;
    # the correction is exact enough to land on the value itself, so such a batch has
    # variance 0 and whitens to exactly 0 (not rounding noise times 1e4).
    mean = mean + masked_sum(values - mean, mask) / n
    denom = count - 1 if unbiased else count
    if denom <= 0:
        return mean, torch.zeros((), dtype=values.dtype, device=values.device)
    return mean, masked_sum((values - mean).square(), mask) / denom


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance over the valid elements (a scalar), Bessel-corrected by default.

    With fewer than two valid elements the unbiased variance is undefined; we return 0
    (verl raises) so that a batch of one valid token whitens to 0 instead of crashing a run.
    """
    return _mean_var(values, mask, unbiased)[1]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` over the valid elements, as verl's ``masked_whiten``.

    Mean and unbiased variance are taken over all valid elements of the batch. The result is
    NOT re-masked here (callers apply :func:`apply_mask`); it has ``values``' dtype.
    """
    mean, var = _mean_var(values, mask, unbiased=True)
    return (values - mean) * torch.rsqrt(var + 1e-8)
