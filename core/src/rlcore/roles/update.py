"""One role's update loop: epochs x mini-batches of forward/backward and an optimizer step.

Used by both role workers (:mod:`rlcore.roles.policy`); it owns the role's LR-schedule
position (``steps``, part of the role's checkpoint map) and applies the update levers of
:mod:`rlcore.roles.levers`. Per-phase times go under ``timing_s/worker/*``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from rlcore.engine import learning_rate
from rlcore.interfaces import BaseEngine, BatchTotals, LossFn
from rlcore.roles.levers import drop_zero_advantage_rows, old_log_probs_from_forward, with_totals
from rlcore.roles.mismatch import MismatchTally

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto
    from rlcore.roles.specs import UpdateSpec

__all__ = ["RoleTrainer", "add_metrics", "clock", "summed"]


@contextmanager
def clock(timing: dict[str, list[float]], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timing.setdefault(f"timing_s/worker/{name}", []).append(time.perf_counter() - start)


def add_metrics(metrics: dict[str, list[float]], new: dict[str, float]) -> None:
    for key, value in new.items():
        metrics.setdefault(key, []).append(float(value))


def summed(timing: dict[str, list[float]]) -> dict[str, float]:
    """One total per phase for this call (a phase may run once per mini-batch)."""
    return {key: sum(values) for key, values in timing.items()}


@attrs.define(eq=False, slots=False)
class RoleTrainer:
    """One role's optimizer-step loop over the rows a worker got; owns the LR position.

    ``steps`` counts optimizer steps actually taken (a non-finite one is skipped and does not
    advance the schedule); it is part of the role's checkpoint map. ``replicas``: how many
    ranks hold each row (the tensor x pipeline-parallel size of the engine's mesh; 1 when it
    is purely data-parallel).
    """

    role: str
    engine: BaseEngine
    update: UpdateSpec
    # The loss ignores rows with zero advantage (rlcore.roles.levers): leave them out.
    skip_zero_advantage_rows: bool = attrs.field(default=False, kw_only=True)
    backend: str = attrs.field(default="gloo", kw_only=True)
    replicas: int = attrs.field(default=1, kw_only=True)
    steps: int = attrs.field(default=0, init=False)

    def lr(self) -> float:
        return learning_rate(self.update.optim, self.steps, self.update.schedule_steps)

    def run(
        self,
        loss_fn: LossFn,
        data: DataProto,
        *,
        step: int,
        temperature: float,
        with_entropy: bool,
        metrics: dict[str, list[float]],
        timing: dict[str, list[float]],
    ) -> None:
        """``epochs`` passes over this rank's mini-batches of ``data``: one step each.

        The mini-batches are the sizes the driver's layout wrote (``meta_info
        ["mini_batch_rows"]``, rows per rank of each), else ``mini_batches`` equal parts.
        A shuffle permutes rows across them each epoch, except with ``group_index`` (rows of
        one group stay together: a pairwise loss), where the order is kept.
        """
        import torch

        update, role = self.update, self.role
        rows = len(data)
        sizes = _mini_batch_sizes(role, rows, data.meta_info.get("mini_batch_rows"), update)
        offsets = [sum(sizes[:m]) for m in range(len(sizes) + 1)]
        # Rows with no valid token: the layout's zero-weight padding (whole rows per rank).
        padding = float((data.batch["response_mask"].sum(-1) == 0).sum()) / max(rows, 1)
        add_metrics(metrics, {f"{role}/padding_rows_frac": padding})
        tally: MismatchTally | None = None
        if role == "actor" and "old_log_probs" not in data.batch:
            # The driver skipped the old-log-prob pass: only exact for one step on the data.
            if update.epochs != 1 or len(sizes) != 1:
                msg = (
                    f"{role}: no old_log_probs, but the update takes {update.epochs} epoch(s) "
                    f"x {len(sizes)} mini-batch(es); they are needed off-policy"
                )
                raise RuntimeError(msg)
            if "rollout_log_probs" in data.batch:
                tally = MismatchTally()  # rollout vs these old log-probs (roles/mismatch.py)
            loss_fn = old_log_probs_from_forward(loss_fn, tally)
        generator = torch.Generator().manual_seed(update.seed + step)
        shuffle = update.shuffle and "group_index" not in data.batch
        for _ in range(update.epochs):
            order = torch.randperm(rows, generator=generator).numpy() if shuffle else None
            for m in range(len(sizes)):
                start, end = offsets[m], offsets[m + 1]
                if order is None:
                    mini_batch = data.slice(start, end)
                else:
                    mini_batch = data.select_idxs(order[start:end])
                step_loss = loss_fn
                if self.skip_zero_advantage_rows and "advantages" in mini_batch.batch:
                    full = len(mini_batch)
                    mini_batch, totals = drop_zero_advantage_rows(
                        mini_batch, _collective_device(self.backend)
                    )
                    totals = _per_replica(totals, self.replicas)
                    step_loss = with_totals(loss_fn, totals)
                    skipped = 1.0 - len(mini_batch) / full
                    add_metrics(metrics, {f"{role}/skipped_rows_frac": skipped})
                with clock(timing, f"{role}_forward_backward"):
                    add_metrics(
                        metrics,
                        self.engine.forward_backward(
                            mini_batch,
                            step_loss,
                            temperature=temperature,
                            with_entropy=with_entropy,
                        ),
                    )
                lr = self.lr()
                with clock(timing, f"{role}_optimizer"):
                    grad_norm = self.engine.optimizer_step(lr=lr)
                finite = math.isfinite(grad_norm)
                self.steps += int(finite)
                add_metrics(
                    metrics,
                    {
                        f"{role}/grad_norm": grad_norm,
                        # 1.0 when the engine skipped the update (non-finite loss or gradient)
                        f"{role}/nonfinite": 0.0 if finite else 1.0,
                        f"{role}/lr": lr,
                    },
                )
        if tally is not None:
            add_metrics(metrics, tally.metrics())


def _mini_batch_sizes(
    role: str, rows: int, laid_out: list[int] | None, update: UpdateSpec
) -> list[int]:
    """This rank's mini-batch sizes: the layout's, else ``update.mini_batches`` equal parts."""
    if laid_out is not None:
        if sum(laid_out) != rows:
            msg = (
                f"{role}: the layout's mini-batches hold {sum(laid_out)} rows per rank, this "
                f"rank got {rows}; lay rows out with rlcore.trainer.layout.mini_batch_layout"
            )
            raise RuntimeError(msg)
        return [int(size) for size in laid_out]
    if rows % update.mini_batches:
        msg = (
            f"{role}: {rows} rows do not split into {update.mini_batches} mini-batches; "
            "the driver lays rows out with rlcore.trainer.layout.mini_batch_layout"
        )
        raise RuntimeError(msg)
    return [rows // update.mini_batches] * update.mini_batches


def _per_replica(totals: BatchTotals, replicas: int) -> BatchTotals:
    """Totals summed over all ranks -> over data-parallel groups (each row on ``replicas`` ranks).

    Every rank of a tensor/pipeline-parallel group holds the same rows, so a world-wide sum
    counts each row exactly ``replicas`` times.
    """
    if replicas == 1:
        return totals
    return BatchTotals(
        tokens=totals.tokens // replicas,
        sequences=totals.sequences // replicas,
        max_response_length=totals.max_response_length,
    )


def _collective_device(backend: str) -> torch.device | None:
    """Where the worker's own collectives put their tensors: the GPU under NCCL."""
    if backend != "nccl":
        return None
    import torch

    return torch.device("cuda", torch.cuda.current_device())
