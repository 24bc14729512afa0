"""ReMax: the greedy response of each prompt is the baseline of its sampled responses.

ReMax (Li et al. 2023, arXiv 2310.10505; verl's ``adv_estimator = "remax"``) is REINFORCE
with a baseline that costs one extra generation per prompt and no critic: the policy's own
greedy (``do_sample = False``) response is scored, and each sampled response's advantage is
how much better it did than that::

    A_t = sum_{t' >= t} r_{t'}  -  r(greedy)        (no std normalisation)

With an outcome reward (one score on the last token) every valid token of a response gets
``r(sample) - r(greedy)``. The step (:class:`ReMaxProgram`) follows verl's ``ray_trainer``:
the un-repeated prompts are generated greedily (phase ``gen_greedy``) and scored by the run's
reward manager (phase ``reward_greedy``); the summed score is ``reward_baselines`` (one per
prompt), repeated to the prompt's ``n`` rows; then the default step (``gen``, old log-probs,
reference, ``reward``, ``adv``, ``update_actor``). The greedy rows are never trained on. As in
verl, the baseline is the greedy *score* (no KL penalty), the returns are those of
``token_level_rewards`` (which hold the KL penalty when ``use_kl_in_reward``).

Metrics per step: ``remax/baseline_reward_mean`` (mean greedy reward: the policy's greedy
accuracy on the training prompts), ``remax/sample_minus_baseline_mean`` (mean advantage per
response), ``remax/sample_beats_baseline_frac`` (responses better than their greedy one),
``remax/greedy_response_length_mean``, and the reward manager's metrics of the greedy
responses under ``remax/greedy/`` (``remax/greedy/<data_source>/acc``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

from rlcore.interfaces import key
from rlcore.rl.algorithm import PolicyGradientAlgorithm, require
from rlcore.rl.step import StepContext, StepProgram, compute_advantages, expand_prompts

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import SamplingParams
    from rlcore.protocol import DataProto

__all__ = ["ReMax", "ReMaxProgram", "compute_remax_outcome_advantage", "greedy_sampling"]

#: The batch key of each row's baseline (verl's name): its prompt's greedy reward, (B,).
BASELINE_KEY = "reward_baselines"


def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_remax_outcome_advantage``: ``(advantages, returns)``, both (B, R).

    ``returns`` is the reversed cumulative sum of the masked rewards; ``advantages`` is
    ``returns - reward_baselines`` on the valid tokens, 0 elsewhere. ``reward_baselines`` (B,)
    is each row's greedy reward (its prompt's). Masked positions are selected out, not
    multiplied (a NaN there stays out); on finite inputs this equals verl's expression.
    """
    import torch

    with torch.no_grad():
        valid = response_mask.bool()
        rewards = torch.where(valid, token_level_rewards, torch.zeros_like(token_level_rewards))
        returns = rewards.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        baseline = reward_baselines.to(returns.dtype).unsqueeze(-1)
        advantages = torch.where(valid, returns - baseline, torch.zeros_like(returns))
    return advantages, returns


def greedy_sampling(sampling: SamplingParams) -> SamplingParams:
    """The training sampling made greedy (verl's ``do_sample = False``): same length budget,
    no temperature, top-p or top-k, and no rollout log-probs (the greedy rows are not trained
    on)."""
    return attrs.evolve(
        sampling, do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, return_log_probs=False
    )


class ReMaxProgram(StepProgram):
    """The ReMax step: the greedy baseline of each prompt, then the default step on ``n``
    sampled responses per prompt with ``reward_baselines`` in the batch."""

    def run(self, ctx: StepContext, batch: DataProto) -> DataProto:
        # --- the baseline: one greedy response per prompt, scored; never trained on -----------
        batch.batch[BASELINE_KEY] = self.baseline(ctx, batch)
        # --- the default step: n sampled rows per prompt (the baseline repeated with them) ---
        batch = ctx.generate(expand_prompts(batch, ctx.n))
        batch = ctx.log_probs_and_values(batch)
        batch = ctx.reward(batch)
        batch = ctx.phase("adv", compute_advantages, ctx.algorithm, batch)
        self._log(ctx, batch)
        ctx.update_actor(batch)
        return batch

    def baseline(self, ctx: StepContext, prompts: DataProto) -> torch.Tensor:
        """Phases ``gen_greedy`` and ``reward_greedy``: each prompt's greedy reward, (B,).

        ``prompts`` is left as it was: the greedy rows are a separate batch (same tensors,
        its own key maps), joined to nothing the update sees.
        """
        greedy = prompts.select(deepcopy=True)
        gen = ctx.phase(
            "gen_greedy",
            ctx.policy.generate_sequences,
            ctx.prompts(greedy),
            greedy_sampling(ctx.sampling),
        )
        greedy = greedy.union(gen)
        scores = ctx.reward(greedy, "reward_greedy", _renamed(ctx.reward_manager))
        lengths = greedy.batch["response_mask"].sum(-1)
        ctx.metrics["remax/greedy_response_length_mean"] = float(lengths.float().mean())
        result: torch.Tensor = scores.batch["token_level_scores"].sum(-1)
        return result

    @staticmethod
    def _log(ctx: StepContext, batch: DataProto) -> None:
        baselines = batch.batch[BASELINE_KEY].float()
        gap = batch.batch["token_level_scores"].sum(-1).float() - baselines
        ctx.metrics |= {
            # per prompt (the batch repeats each baseline n times: the mean is the same)
            "remax/baseline_reward_mean": float(baselines.mean()),
            "remax/sample_minus_baseline_mean": float(gap.mean()),
            "remax/sample_beats_baseline_frac": float((gap > 0).float().mean()),
        }


def _renamed(reward_manager: Any) -> Any:
    """The reward manager, its metrics under ``remax/greedy/`` (so the sampled responses'
    ``reward/...`` metrics of the same step stay theirs)."""

    def score(batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        scores, metrics = reward_manager(batch)
        return scores, {f"remax/greedy/{k.removeprefix('reward/')}": v for k, v in metrics.items()}

    return score


def _only_remax(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if value != "remax":
        msg = (
            f"ReMax computes its own advantages (sample reward - greedy reward); got "
            f"{value!r}: leave it 'remax', or pick the algorithm of that estimator"
        )
        raise ValueError(msg)


class ReMax(PolicyGradientAlgorithm):
    """ReMax (see the module docstring): no critic, a greedy baseline per prompt.

    ``[algorithm]`` takes :class:`PolicyGradientAlgorithm.Config`'s options (clip ratios,
    ``loss_agg_mode``, ``policy_loss``, KL loss or KL in the reward, entropy bonus, rollout
    importance sampling); ``adv_estimator`` is verl's key and value, ``"remax"``, and nothing
    else (the estimator reads the batch's ``reward_baselines``, which only this program fills).
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        adv_estimator: Literal["remax"] = key(
            "remax",
            "remax only: reward(sample) - reward(greedy response), verl's "
            "compute_remax_outcome_advantage (no std normalisation).",
            validator=_only_remax,
        )

    config: ReMax.Config

    def compute_advantages(self, batch: DataProto) -> DataProto:
        """verl's ReMax estimator on ``token_level_rewards`` and ``reward_baselines``."""
        advantages, returns = compute_remax_outcome_advantage(
            require(batch, "token_level_rewards"),
            require(batch, BASELINE_KEY),
            require(batch, "response_mask"),
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch

    def step_program(self) -> ReMaxProgram:
        return ReMaxProgram()
