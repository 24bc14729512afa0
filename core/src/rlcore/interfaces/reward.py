"""The reward contracts: a per-sample rule reward (:class:`BaseReward`) and a batched scorer
(:class:`BaseBatchReward`) with what it reads and returns."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from rlcore.interfaces.config_key import POLL_MAX_S, seconds
from rlcore.interfaces.declarations import GenerationRole

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

# The bounds of reward.timeout_s and reward.batch_timeout_s, which the core's scoring holds to:
# the scoring pool polls a worker's pipe for up to 1.5 x reward.timeout_s (with its grace).
REWARD_TIMEOUT: Final = seconds(
    POLL_MAX_S / 1.5, "the scoring pool polls 1.5 x this, a C int of ms"
)
BATCH_REWARD_TIMEOUT: Final = seconds(holder="a thread's join")


class BaseReward(abc.ABC):
    """A rule reward: pure, fast, deterministic; never ``eval`` model output in-process
    (``rlcore-code`` runs model-written code in a bubblewrap sandbox instead). One sample per
    call, in the reward manager's process pool, each call bounded by ``[reward] timeout_s``;
    a scorer of whole batches (a model, a remote judge) is a :class:`BaseBatchReward`.

    Example::

        reward.score("openai/gsm8k", "... #### 42", "42", {"index": 3})
        # -> 1.0, or {"score": 1.0, "acc": True, "pred": "42"}
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The reward's own options (``[reward.options.NAME]``)."""

    def __init__(self, config: BaseReward.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyReward()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> float | dict[str, Any]:
        """Score one decoded response. A dict carries ``score`` plus extras (``acc``, ``pred``)."""


@attrs.frozen(kw_only=True)
class RewardBatch:
    """The rows a :class:`BaseBatchReward` scores in one call (``B`` rows, ``P``, ``R`` as above).

    The reward manager builds it from the step's batch: only the rows whose ``data_source``
    selects the scorer and whose response is not empty (an empty response has no token to put
    a score on; it scores 0), in batch order.

    - ``prompts``, ``responses``: the decoded text (special tokens skipped) of each row's
      prompt and of its valid response tokens, as a per-sample reward's ``solution_str``.
    - ``prompt_ids`` (B, P) left-padded, ``response_ids`` (B, R) right-padded,
      ``attention_mask`` (B, P+R), ``response_mask`` (B, R) float32 0/1 (the valid response
      tokens; a multi-turn row has holes where tool output was inserted): what a reward model
      feeds its forward pass.
    - ``data_sources``, ``ground_truths`` (``reward_model["ground_truth"]``), ``extra_infos``
      (``extra_info``, with an agent run's turn and tool counts merged in, or None): per row,
      as a per-sample reward receives them.
    - ``data``: the same rows as a :class:`~rlcore.protocol.DataProto`, every tensor and
      per-row column of the step (``reward_model``, ``uid``, ...), for a scorer that hands the
      batch to a worker group or reads a column not listed here.
    """

    prompts: tuple[str, ...]
    responses: tuple[str, ...]
    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    data_sources: tuple[str, ...]
    ground_truths: tuple[Any, ...]
    extra_infos: tuple[dict[str, Any] | None, ...]
    data: DataProto

    def __len__(self) -> int:
        return len(self.responses)


@attrs.frozen(kw_only=True)
class BatchScores:
    """What :meth:`BaseBatchReward.score_batch` returns for a :class:`RewardBatch` of B rows.

    - ``scores``: a floating-point tensor, either (B,) — one sequence-level score per row,
      placed on the row's last valid response token like a per-sample reward's — or (B, R) —
      token-level scores aligned with ``response_ids`` (entries outside ``response_mask`` are
      ignored). Every score must be finite.
    - ``extras``: per-row values by name (``{"acc": [True, False, ...]}``), B each; they reach
      the batch's per-row columns as a per-sample reward's dict extras do (``acc`` feeds the
      ``reward/<data_source>/acc`` metric).
    - ``metrics``: floats logged as ``reward/scorer/<name>/<key>`` (``name``: the scorer's
      registered name), e.g. a judge's parse failures or a remote call's latency, beside
      the manager's ``reward/scorer/<name>/mean`` (the mean of ``scores``' rows).
    """

    scores: torch.Tensor
    extras: Mapping[str, Sequence[Any]] = attrs.Factory(dict)
    metrics: Mapping[str, float] = attrs.Factory(dict)


class BaseBatchReward(abc.ABC):
    """A batched scorer: a whole :class:`RewardBatch` in, :class:`BatchScores` out.

    Registered under the same ``register_rewards`` hook and selected by the same ``[reward]``
    keys as a per-sample :class:`BaseReward` (a registered class that subclasses this one is
    batched), and combined with the others by ``[reward] weights``.

    It runs in the driver process, once per step on the rows that select it, not in the
    per-sample rewards' process pool: a batched scorer is usually a model (a reward model, a
    judge) or a remote call, which batches well and holds state a pool would copy. Its wall
    clock is bounded by ``[reward] batch_timeout_s`` (900 s by default); past it, or when it
    raises or returns the wrong shape, the run stops with one error naming the scorer (a
    per-sample reward's failure scores 0 instead: one row, not the whole batch, is at fault).

    Example::

        class LengthPenalty(BaseBatchReward):
            def score_batch(self, batch):
                n = batch.response_mask.sum(-1)
                return BatchScores(scores=-n / batch.response_mask.shape[1])
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The scorer's own options (``[reward.options.NAME]``)."""

    def __init__(self, config: BaseBatchReward.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyScorer()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def score_batch(self, batch: RewardBatch) -> BatchScores:
        """Score every row of ``batch``: (B,) sequence-level or (B, R) token-level scores."""

    @property
    def roles(self) -> tuple[GenerationRole, ...]:
        """The worker roles this scorer needs (a judge model); none by default.

        The core places each (:class:`GenerationRole`) before the first step and hands
        their worker groups to :meth:`bind_roles`.
        """
        return ()

    def bind_roles(self, groups: Mapping[str, Any]) -> None:
        """Receive the worker group of each declared role, by name, before the first call
        of :meth:`score_batch`; no-op by default."""

    def close(self) -> None:
        """Release what the scorer holds (a client, a model); no-op by default.

        The reward manager calls it once, when the run ends.
        """
