"""What a plugin declares about itself: an algorithm's needs and extra roles, a batched
reward's generation roles, a rollout's traits."""

from __future__ import annotations

from typing import Any, Final, Literal

import attrs

from rlcore.interfaces.specs import Dtype


@attrs.frozen(kw_only=True)
class AlgorithmNeeds:
    """What an algorithm needs from a run (:attr:`BaseAlgorithm.needs`); the roles follow it.

    - ``reference``: ``ref_log_prob`` in the batch (a KL loss or KL penalty): a reference model.
    - ``critic``: ``values`` in the batch and :meth:`BaseAlgorithm.value_loss`: a critic.
    - ``entropy``: :meth:`BaseAlgorithm.policy_loss` reads ``outputs.entropy`` with gradient.
    - ``rollout_log_probs``: the loss reads the rollout's ``rollout_log_probs``.
    - ``old_log_probs_on_driver``: :meth:`BaseAlgorithm.compute_rewards` or
      :meth:`~BaseAlgorithm.compute_advantages` read ``old_log_probs`` on the driver, so the
      separate old-log-prob pass is kept. True (the default) is the safe answer; False lets an
      on-policy update take them from its own training forward.
    - ``zero_advantage_rows_inert``: a row whose advantages are all zero adds nothing to the
      loss's gradient, so the worker may skip its backward pass. False (the default) is safe.
    - ``extra_roles``: the roles beyond actor/rollout/reference/critic (:class:`ExtraRole`),
      each configured by ``[roles.<name>]``, placed and checkpointed like the built-in ones.
    - ``loss_keys``: batch keys the policy loss reads beyond the default ones (e.g. an extra
      role's ``teacher_log_prob``); the driver sends them with the update's rows.
    """

    reference: bool = False
    critic: bool = False
    entropy: bool = False
    rollout_log_probs: bool = False
    old_log_probs_on_driver: bool = True
    zero_advantage_rows_inert: bool = False
    extra_roles: tuple[ExtraRole, ...] = ()
    loss_keys: tuple[str, ...] = ()


#: What an extra role's worker computes (:attr:`ExtraRole.computes`).
ROLE_COMPUTES: Final = ("log_prob",)


@attrs.frozen(kw_only=True)
class ExtraRole:
    """A role an algorithm needs beyond the built-in ones (:attr:`BaseAlgorithm.extra_roles`).

    ``name``: the role's name, its config section ``[roles.<name>]`` (``model.path`` and
    ``engine`` options of its own) and its folder in a checkpoint. ``computes``: what its
    worker computes; ``"log_prob"``: the log-probs (B, R) of the batch's responses under the
    role's model (a teacher for distillation), returned as :attr:`output_key`.
    ``trainable``: False for a frozen model (no optimizer; the only kind so far).

    The algorithm's step program calls it like a built-in role::

        batch |= ctx.phase("teacher", ctx.roles["teacher"].compute_log_prob, model_in)
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z][a-z0-9_]*"))
    computes: Literal["log_prob"] = attrs.field(
        default="log_prob", validator=attrs.validators.in_(ROLE_COMPUTES)
    )
    trainable: bool = attrs.field(default=False, validator=attrs.validators.in_((False,)))

    @property
    def output_key(self) -> str:
        """The batch key of what the role computes: ``<name>_log_prob``."""
        return f"{self.name}_{self.computes}"


@attrs.frozen(kw_only=True)
class GenerationRole:
    """A frozen model served by a rollout engine in a worker role of its own, declared by a
    batched reward (:attr:`BaseBatchReward.roles`): a generative judge.

    The core places one worker per process of the run's pool (colocated with the policy, as
    an extra role is), builds the ``rollout`` plugin there on ``model_path`` and hands the
    reward the role's worker group through :meth:`BaseBatchReward.bind_roles`. Its weights
    are never synced: the policy's updates do not reach it. The group has one method::

        out = group.generate_text(prompts, sampling).get()   # DataProto in, DataProto out

    (non-blocking: the call returns a future whose ``refs`` the caller may wait on with a
    limit of its own before ``get()``).

    ``prompts.non_tensor_batch["prompt_text"]``: one text per row, which the worker wraps as
    one user turn of the model's chat template (``apply_chat_template``; else the text is
    tokenized as it is), keeps the last ``max_prompt_length`` tokens of (counted in
    ``out.non_tensor_batch["prompt_truncated"]``) and generates from with ``sampling``
    (:class:`SamplingParams`; ``max_new_tokens`` at most ``max_response_length``);
    ``out.non_tensor_batch["generated_text"]`` is the decoded answer (special tokens
    skipped). Rows are split over the group's data-parallel ranks.

    ``name``: the role's name (the worker group's, in logs and errors); ``rollout`` and
    ``rollout_options``: the rollout plugin and its ``Config`` instance (None: defaults);
    ``dtype`` None: the run's ``model.dtype``.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z][a-z0-9_]*"))
    model_path: str
    rollout: str = "hf"
    rollout_options: Any = None
    dtype: Dtype | None = None
    trust_remote_code: bool = False
    max_prompt_length: int = attrs.field(default=1024, validator=attrs.validators.ge(1))
    max_response_length: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    apply_chat_template: bool = True
    # The key of the reward's options that set model_path (errors name
    # reward.options.<reward>.<model_key>; checked before Ray starts).
    model_key: str = "model_path"


@attrs.frozen(kw_only=True)
class RolloutTraits:
    """What the core must know about a rollout before building it (:meth:`BaseRollout.traits`).

    - ``cheap_log_probs``: the rollout returns ``rollout_log_probs`` at no extra pass (vLLM's
      sampler has them), so the driver asks for them by default for the mismatch metrics
      (``[rollout] log_prob_metrics``).
    - ``lora_adapters``: it serves LoRA adapters on the base weights
      (:meth:`BaseRollout.update_adapter`) instead of taking merged weights.
    - ``ranks_per_engine``: policy workers one engine spans (tensor parallelism); 1: each
      worker is an engine of its own. Its ranks then declare their place with
      :meth:`BaseRollout.dispatch_info`.
    - ``partial_rollouts``: it takes ``update_weights(stream, version=...)`` from another
      thread while ``generate`` runs and continues its requests with the new weights
      (``rollout.partial_rollouts``, ``RolloutSpec.partial_rollouts``).
    """

    cheap_log_probs: bool = False
    lora_adapters: bool = False
    partial_rollouts: bool = False
    ranks_per_engine: int = attrs.field(default=1, validator=attrs.validators.ge(1))
