"""DAPO: GRPO advantages with dynamic sampling, overlong reward shaping and clip-higher.

Decoupled clip and dynamic sampling policy optimisation (arXiv 2503.14476), with verl's
option names (``recipe/dapo``):

- **Dynamic sampling** (``[algorithm.filter_groups]``, verl's ``filter_groups``): after
  generation and scoring, a prompt whose ``n`` responses all got the same ``metric`` (``acc``,
  ``score``, ``seq_reward`` or ``seq_final_reward``) gives no gradient under group-relative
  advantages, so its group is dropped and more prompts are generated until
  ``data.train_batch_size`` prompts with differing rewards are in hand; the surplus of the
  last round is cut. ``max_num_gen_batches`` bounds the generation rounds of one step
  (0: unbounded); reaching it stops the run with one line naming the key. A step that keeps
  resampling logs its progress (rounds, groups kept) every :data:`PROGRESS_EVERY_S` seconds,
  so a run that cannot fill its batch is seen doing so. A group of one (``n = 1``) is kept, as
  verl does.
- **Overlong reward shaping** (``[algorithm.overlong_buffer]``, verl's ``overlong_buffer``):
  a response longer than ``max_response_length - len`` tokens gets
  ``min(-(length - (max_response_length - len)) / len * penalty_factor, 0)`` added to its
  score (on its last valid token), a soft punishment over the last ``len`` tokens.
- **Clip-higher** and the **token-level loss** are the core's ``clip_ratio_high`` (default
  here 0.28, as the paper) and ``loss_agg_mode = "token-mean"``.

Metrics per step: ``train/num_gen_batches`` (verl's name: generation rounds),
``dapo/filtered_groups`` (groups dropped), ``dapo/kept_groups`` and, with the buffer,
``dapo/overlong_penalty/mean`` and ``dapo/overlong_frac``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np

from rlcore.errors import RlcoreError
from rlcore.interfaces import key
from rlcore.rl.advantages import GRPOOptions
from rlcore.rl.algorithm import PolicyGradientAlgorithm, adv_estimator_key
from rlcore.rl.step import StepContext, StepProgram, compute_advantages, expand_prompts

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = [
    "DAPO",
    "PROGRESS_EVERY_S",
    "DAPOProgram",
    "DynamicSamplingError",
    "keep_groups",
    "overlong_penalty",
]

# A step still resampling after this long says so, and again every as long.
PROGRESS_EVERY_S = 30.0

_v = attrs.validators

Metric = Literal["acc", "score", "seq_reward", "seq_final_reward"]


class DynamicSamplingError(RlcoreError):
    """Dynamic sampling reached ``max_num_gen_batches`` before the batch was full."""


@attrs.frozen(kw_only=True)
class FilterGroupsConfig:
    """``[algorithm.filter_groups]`` (verl's names)."""

    enable: bool = key(
        True,
        "Dynamic sampling: drop prompts whose n responses all got the same "
        "metric and generate more until data.train_batch_size prompts are in "
        "hand.",
    )
    metric: Metric = key(
        "acc",
        "The per-response value compared within a prompt's group.",
        validator=_v.in_(("acc", "score", "seq_reward", "seq_final_reward")),
    )
    max_num_gen_batches: int = key(
        10,
        "Generation rounds of one step before the run stops with an error; 0: unbounded.",
        validator=_v.ge(0),
    )  # 0: unbounded


@attrs.frozen(kw_only=True)
class OverlongBufferConfig:
    """``[algorithm.overlong_buffer]`` (verl's names): the last ``len`` tokens are punished."""

    enable: bool = key(
        False,
        "Overlong reward shaping: punish responses longer than data.max_response_length - len.",
    )
    len: int = key(
        0,
        "Tokens of the buffer at the end of the response budget; >= 1 when enabled.",
        validator=_v.ge(0),
    )
    penalty_factor: float = key(
        1.0,
        "Penalty at the full response length, falling linearly to 0 at the buffer's start.",
        validator=_v.ge(0.0),
    )


def overlong_penalty(
    lengths: torch.Tensor, *, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """verl's overlong reward: ``min(-(L - (L_max - buffer)) / buffer * factor, 0)`` per row.

    ``lengths`` (B,): valid response tokens. 0 for ``L <= L_max - buffer``, falling linearly
    to ``-factor`` at ``L = L_max``.
    """
    import torch

    expected = max_response_length - buffer_len
    exceed = lengths.to(torch.float32) - expected
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def keep_groups(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Row indices of the groups (same ``uid``) whose ``values`` differ, or of one row.

    verl's rule: keep a prompt when the std of its metric is > 0 or it has one sample. The
    rows keep their order, so each kept group stays contiguous.
    """
    by_uid: dict[object, list[float]] = {}
    for uid, value in zip(uids.tolist(), values.tolist(), strict=True):
        by_uid.setdefault(uid, []).append(float(value))
    kept = {uid for uid, vals in by_uid.items() if len(vals) == 1 or float(np.std(vals)) > 0}
    return np.asarray([i for i, uid in enumerate(uids.tolist()) if uid in kept], dtype=np.int64)


class DAPOProgram(StepProgram):
    """The DAPO step: generate and score until the batch is full of informative groups, then
    the default tail (old log-probs, reference, advantages, update) on the kept rows."""

    def __init__(self, config: DAPO.Config) -> None:
        super().__init__()
        self.config = config

    def run(self, ctx: StepContext, batch: DataProto) -> DataProto:
        from rlcore.protocol import DataProto

        filt, prompts = self.config.filter_groups, len(batch)
        kept: list[DataProto] = []
        rounds = groups_in = filtered = 0
        last_line = time.monotonic()
        # --- generate, score, filter; more prompts until the batch is full -------------------
        while True:
            rounds += 1
            gen = ctx.generate(expand_prompts(batch, ctx.n))
            gen = ctx.reward(gen)
            self._shape_overlong(ctx, gen)
            rows = (
                keep_groups(gen.non_tensor_batch["uid"], self._metric(gen)) if filt.enable else None
            )
            part = gen if rows is None else gen.select_idxs(rows)
            filtered += len(batch) - len(part) // ctx.n
            groups_in += len(part) // ctx.n
            part.meta_info.clear()  # parts of two epochs differ in meta_info["epoch"]
            kept.append(part)
            if groups_in >= prompts:
                break
            if filt.max_num_gen_batches and rounds >= filt.max_num_gen_batches:
                msg = (
                    f"algorithm.filter_groups.max_num_gen_batches = {filt.max_num_gen_batches}: "
                    f"{rounds} generation rounds gave {groups_in} of {prompts} prompts whose "
                    f"{filt.metric!r} differs within the group; the data may be too easy or too "
                    "hard, raise rollout.n, or set max_num_gen_batches = 0 (no bound)"
                )
                raise DynamicSamplingError(msg)
            if time.monotonic() - last_line >= PROGRESS_EVERY_S:
                last_line = time.monotonic()
                self._progress(rounds, groups_in, prompts)
            batch = ctx.next_prompts()
        ctx.metrics |= {
            "train/num_gen_batches": float(rounds),
            "dapo/filtered_groups": float(filtered),
            "dapo/kept_groups": float(groups_in),
        }
        batch = DataProto.concat(kept)[: prompts * ctx.n]  # whole groups: rows are contiguous
        # --- the default tail ----------------------------------------------------------------
        batch = ctx.log_probs_and_values(batch)
        batch = ctx.phase("adv", compute_advantages, ctx.algorithm, batch)
        ctx.update_actor(batch)
        return batch

    def _progress(self, rounds: int, groups_in: int, prompts: int) -> None:
        filt = self.config.filter_groups
        bound = filt.max_num_gen_batches
        log.info(
            "dapo: still resampling this step: %d generation round(s), %d of %d prompts kept "
            "(their %r differs within the group); algorithm.filter_groups.max_num_gen_batches "
            "= %d%s",
            rounds,
            groups_in,
            prompts,
            filt.metric,
            bound,
            " (no bound)" if bound == 0 else "",
        )

    def _metric(self, gen: DataProto) -> np.ndarray:
        metric = self.config.filter_groups.metric
        if metric in ("seq_reward", "seq_final_reward"):  # no KL in the reward before this
            return gen.batch["token_level_scores"].sum(-1).double().numpy()
        if metric not in gen.non_tensor_batch:
            msg = (
                f"algorithm.filter_groups.metric = {metric!r}: the reward returned no "
                f"{metric!r} per sample (it has {sorted(gen.non_tensor_batch)}); use "
                "'seq_reward' or a reward that reports it"
            )
            raise DynamicSamplingError(msg)
        return np.asarray([float(v) for v in gen.non_tensor_batch[metric]], dtype=np.float64)

    def _shape_overlong(self, ctx: StepContext, gen: DataProto) -> None:
        import torch

        buf = self.config.overlong_buffer
        if not buf.enable:
            return
        mask = gen.batch["response_mask"]
        lengths = mask.sum(-1)
        penalty = overlong_penalty(
            lengths,
            max_response_length=ctx.sampling.max_new_tokens,
            buffer_len=buf.len,
            penalty_factor=buf.penalty_factor,
        )
        scores = gen.batch["token_level_scores"]
        last = (lengths - 1).clamp(min=0)
        scores[torch.arange(len(scores)), last] += penalty.to(scores.dtype)
        ctx.metrics["dapo/overlong_penalty/mean"] = float(penalty.mean())
        ctx.metrics["dapo/overlong_frac"] = float((penalty < 0).float().mean())


class DAPO(PolicyGradientAlgorithm):
    """DAPO (see the module docstring); GRPO's group-normalised advantages, no critic."""

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config, GRPOOptions):
        clip_ratio_high: float = key(
            0.28,
            "PPO clip range upper side; DAPO's clip-higher (0.28, the paper's).",
            validator=_v.ge(0.0),
        )  # clip-higher
        # GRPO's group-normalised advantages, from the core's estimator registry
        adv_estimator: str | None = adv_estimator_key(
            "grpo",
            "The advantage estimator; grpo: group-normalised, as GRPO.",
        )
        filter_groups: FilterGroupsConfig = attrs.Factory(FilterGroupsConfig)
        overlong_buffer: OverlongBufferConfig = attrs.Factory(OverlongBufferConfig)

        def __attrs_post_init__(self) -> None:
            buf = self.overlong_buffer
            if buf.enable and buf.len < 1:
                msg = "overlong_buffer.len must be >= 1 when overlong_buffer.enable"
                raise ValueError(msg)
            if self.use_kl_in_reward and self.filter_groups.metric == "seq_final_reward":
                msg = (
                    "filter_groups.metric 'seq_final_reward' with use_kl_in_reward: the KL "
                    "penalty is applied after the filter here; use 'seq_reward'"
                )
                raise ValueError(msg)

    config: DAPO.Config

    def step_program(self) -> DAPOProgram:
        return DAPOProgram(self.config)
