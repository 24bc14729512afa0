"""Best-of-n (rejection-sampling) fine-tuning: a supervised step on each prompt's best responses.

RAFT (arXiv 2304.06767), rejection-sampling fine-tuning and ReST's "improve" step share one
loop: sample ``n`` responses per prompt (a group, like GRPO's), score them, keep at most
``keep_per_prompt`` of the best whose score reaches ``min_score``, and fine-tune on those rows
only. The rows it drops never reach the update (:attr:`BestOfNProgram.trains_subset`: no
zero-weight rows ride along), so the update's cost scales with what is kept.

Loss: the negative log-likelihood of the kept responses, each token weighted by its row's
weight (``advantages``: 1.0 on the valid tokens of a kept row), aggregated by
``loss_agg_mode`` over the mini-batch's totals, which count the kept rows only: with
``token-mean`` the loss is divided by the kept tokens of the mini-batch (over all ranks), so
a step with few kept rows is not scaled down (verl's ``loss_agg_mode`` semantics).

A step where no response of any prompt reaches ``min_score`` draws the next batch of prompts
(``ctx.next_prompts``) and tries again, at most ``max_rounds`` rounds; the phases ``gen`` and
``reward`` then run once per round (their metrics per round: "Metrics of a repeated phase" in
``docs/writing-an-algorithm.md``).

Metrics per step: ``best_of_n/kept_rows``, ``best_of_n/kept_frac`` (kept rows over sampled
rows), ``best_of_n/prompts_kept_frac`` (prompts with at least one kept row) and
``train/num_gen_batches`` (rounds, DAPO's name). The step's batch metrics (``critic/score/mean``,
the console's "reward") are those of the rows it trained on, the kept ones (1.0 with a 0/1
reward); the sampled responses' are the reward manager's ``reward/<data_source>/score``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from rlcore.errors import ConfigError
from rlcore.interfaces import BaseAlgorithm, key
from rlcore.rl.losses import LOSS_AGG_MODES, LossAggMode, agg_loss
from rlcore.rl.step import StepContext, StepProgram, compute_advantages, expand_prompts

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import BatchTotals, ModelOutputs
    from rlcore.protocol import DataProto

__all__ = ["BestOfN", "BestOfNProgram", "best_rows"]

_v = attrs.validators


def best_rows(uids: Any, scores: Any, *, keep_per_prompt: int, min_score: float) -> list[int]:
    """Indices of the rows to train on, in batch order: per prompt (``uids``), its best
    ``keep_per_prompt`` rows by score among those with ``score >= min_score`` (ties: the
    earlier row)."""
    by_prompt: dict[Any, list[int]] = {}
    for i, uid in enumerate(uids):
        if float(scores[i]) >= min_score:
            by_prompt.setdefault(uid, []).append(i)
    kept: list[int] = []
    for rows in by_prompt.values():
        kept += sorted(rows, key=lambda i: (-float(scores[i]), i))[:keep_per_prompt]
    return sorted(kept)


class BestOfNProgram(StepProgram):
    """Generate ``n`` per prompt, score, keep the best, fine-tune on the kept rows only."""

    trains_subset = True

    def run(self, ctx: StepContext, batch: DataProto) -> DataProto:
        from rlcore.protocol import DataProto

        cfg: BestOfN.Config = ctx.algorithm.config  # type: ignore[assignment]
        kept: list[DataProto] = []
        sampled = prompts_kept = prompts_seen = 0
        rounds = 0
        # --- sample and score; another batch of prompts only when nothing was kept ---------
        while not kept:
            if rounds == cfg.max_rounds:
                msg = (
                    f"best_of_n: no response reached algorithm.min_score={cfg.min_score} in "
                    f"{rounds} round(s) of prompts; lower algorithm.min_score or raise "
                    "algorithm.max_rounds"
                )
                raise ConfigError(msg)
            prompts = batch if rounds == 0 else ctx.next_prompts()
            rows = ctx.reward(ctx.generate(expand_prompts(prompts, ctx.n)))
            rounds += 1
            uids = rows.non_tensor_batch["uid"]
            keep = best_rows(
                uids,
                rows.non_tensor_batch["score"],
                keep_per_prompt=cfg.keep_per_prompt,
                min_score=cfg.min_score,
            )
            sampled += len(rows)
            prompts_seen += len(set(uids))
            prompts_kept += len({uids[i] for i in keep})
            if keep:
                kept.append(rows.select_idxs(np.asarray(keep, dtype=np.int64)))
        train = kept[0] if len(kept) == 1 else DataProto.concat(kept)
        # --- weights, then the forward passes the run keeps (on the kept rows only) ---------
        train = ctx.phase("adv", compute_advantages, ctx.algorithm, train)
        train = ctx.log_probs_and_values(train)
        ctx.metrics |= {
            "best_of_n/kept_rows": float(len(train)),
            "best_of_n/kept_frac": len(train) / sampled,
            "best_of_n/prompts_kept_frac": prompts_kept / prompts_seen,
            "train/num_gen_batches": float(rounds),
        }
        ctx.update_actor(train)
        return train


class BestOfN(BaseAlgorithm):
    """Best-of-n / rejection-sampling fine-tuning (see the module docstring).

    No reference, critic or old log-probs on the driver: the loss is a weighted NLL, so the
    on-policy update takes its forward's log-probs (:mod:`rlcore.roles.levers`).
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseAlgorithm.Config):
        keep_per_prompt: int = key(
            1,
            "Responses kept per prompt (its best by score); the others are not trained on.",
            validator=_v.ge(1),
        )
        min_score: float = key(
            1.0,
            "The score a response needs to be kept (1.0: correct under a 0/1 rule reward).",
        )
        max_rounds: int = key(
            4,
            "Batches of prompts a step may draw when no response reaches min_score.",
            validator=_v.ge(1),
        )
        loss_agg_mode: LossAggMode = key(
            "token-mean",
            "How the kept rows' token losses become the mini-batch loss (token-mean: divided "
            "by the kept tokens of the mini-batch).",
            validator=_v.in_(LOSS_AGG_MODES),
        )

    config: BestOfN.Config

    @property
    def needs_old_log_probs_on_driver(self) -> bool:
        return False

    def step_program(self) -> StepProgram:
        return BestOfNProgram()

    def compute_advantages(self, batch: DataProto) -> DataProto:
        """Each kept row's weight on its valid tokens: ``advantages`` = ``returns`` = 1.0."""
        mask = batch.batch["response_mask"]
        weights = mask.to(batch.batch["token_level_rewards"].dtype)  # (B, R): 1 on kept tokens
        batch.batch["advantages"] = weights
        batch.batch["returns"] = weights.clone()
        return batch

    def policy_loss(
        self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Weighted NLL of the kept rows, aggregated over the mini-batch ``totals``."""
        if outputs.log_probs is None:
            msg = "best_of_n: the loss needs outputs.log_probs"
            raise RuntimeError(msg)
        mask = batch.batch["response_mask"]
        nll = -outputs.log_probs * batch.batch["advantages"]  # (b, R)
        loss = agg_loss(nll, mask, self.config.loss_agg_mode, totals)
        valid = mask.sum().clamp(min=1)
        # The micro-batch's token-mean NLL (the loop averages micro-batches by tokens).
        mean_nll = float(((-outputs.log_probs.detach()) * mask).sum() / valid)
        return loss, {"actor/pg_loss": mean_nll}
