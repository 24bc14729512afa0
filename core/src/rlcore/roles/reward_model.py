"""The reward-model role (``rm``): a frozen sequence-classification model on a training engine.

``[reward_model] enable = true`` adds it to the run (verl's ``RewardModelWorker``):
:func:`rlcore.trainer.specs.build_reward_model_spec` makes its spec on the driver,
:func:`rlcore.trainer.builder.build_workers` places it colocated with the policy (one process
per device, its own worker-group view), and each step's program calls it as phase ``rm``::

    batch |= ctx.phase("rm", ctx.reward_model.compute_rm_score, ctx.rm_input(batch))

It returns ``rm_scores`` (B, R): the model's score on each row's last valid response token,
which the reward manager's scorer ``rm`` (:class:`rlcore.reward.model.RewardModelScores`)
mixes with the rule rewards by ``[reward_model] weight``. When its tokenizer differs from the
policy's, the rows are decoded and encoded again in its own tokens and chat template
(:func:`rlcore.reward.model.rm_inputs`).

Checkpoint and resume: the model is frozen, so a checkpoint keeps only which model it was
(its folder ``rm/``); a resume rebuilds it from ``reward_model.model.path`` and stops, naming
the key, when that path is not the one the checkpoint was written with.

Bad input, one line before Ray starts
(:func:`rlcore.preflight.reward_model.check_reward_model`): an enabled reward model whose
folder does not exist, or whose ``config.json`` is not a sequence-classification model with
one label.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.roles.frozen_model import FrozenModelWorker

if TYPE_CHECKING:
    from rlcore.protocol import DataProto
    from rlcore.roles.specs import RewardModelSpec

log = logging.getLogger(__name__)

__all__ = ["REWARD_MODEL_MESH", "RM_ROLE", "RewardModelWorker"]

RM_ROLE = "rm"  # verl's role name; the worker group's view and the checkpoint folder
REWARD_MODEL_MESH = "reward_model"
_RM = mesh_dispatch_mode(REWARD_MODEL_MESH)


class RewardModelWorker(FrozenModelWorker):
    """The reward model's engine: ``compute_rm_score`` gives ``rm_scores`` (B, R)."""

    spec: RewardModelSpec

    def __init__(self, spec: RewardModelSpec) -> None:
        super().__init__(spec)
        self._tokenizers: tuple[Any, Any] | None = None
        self._retokenize = spec.retokenize == "always"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from transformers import AutoTokenizer

        from rlcore.reward.model import same_tokenizer

        spec = self.spec
        self._start_engine(REWARD_MODEL_MESH)
        if spec.retokenize != "never":
            policy = AutoTokenizer.from_pretrained(
                spec.policy_tokenizer_path, trust_remote_code=spec.policy_trust_remote_code
            )
            rm = AutoTokenizer.from_pretrained(
                spec.engine.spec.model_path, trust_remote_code=spec.engine.spec.trust_remote_code
            )
            self._tokenizers = (policy, rm)
            if spec.retokenize == "auto":
                self._retokenize = not same_tokenizer(policy, rm)
        log.info(
            "rank %d: reward model ready (%s)%s",
            self.rank,
            spec.engine.spec.model_path,
            ", re-tokenising the policy's rows" if self._retokenize else "",
        )

    @register(dispatch_mode=_RM)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): the reward model's score on each row's last response token."""
        from rlcore.protocol import DataProto
        from rlcore.reward.model import RM_SCORES, at_last_token, rm_inputs
        from rlcore.roles.update import clock, summed

        timing: dict[str, list[float]] = {}
        with clock(timing, "rm_tokenize"):
            policy_tok, rm_tok = self._tokenizers or (None, None)
            inputs = rm_inputs(
                data,
                policy_tokenizer=policy_tok,
                rm_tokenizer=rm_tok,
                retokenize=self._retokenize,
                max_length=self.spec.max_length,
            )
        with clock(timing, "rm_forward"):
            scores = self._engine().compute_rm_score(DataProto.from_dict(tensors=inputs))
        return DataProto.from_dict(
            tensors={RM_SCORES: at_last_token(scores, data.batch["response_mask"])},
            meta_info={"metrics": summed(timing)},
        )

    def checkpoint_role(self) -> str:
        return RM_ROLE

    def frozen_model(self) -> tuple[str, str]:
        return "the reward model", "reward_model.model.path"
