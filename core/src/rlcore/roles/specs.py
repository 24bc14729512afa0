"""The spec values a role worker receives: what to build and how to update, nothing else.

The driver builds them from the run config (:mod:`rlcore.trainer.specs`) and pickles them to
the workers; a worker never reads the run config. They are plain frozen values, so a worker
process imports this module without the driver's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from rlcore.config.schema import DEFAULT_WEIGHT_SYNC_BUCKET_BYTES
from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec
from rlcore.plugins import Component
from rlcore.workers.worker import WorkerSettings

if TYPE_CHECKING:
    from rlcore.config import AgentConfig

__all__ = [
    "AgentSpec",
    "CriticSpec",
    "EngineRole",
    "GenerationRoleSpec",
    "PolicySpec",
    "RewardModelSpec",
    "RoleSpec",
    "RolloutWorkerSpec",
    "UpdateSpec",
]


@attrs.frozen(kw_only=True)
class UpdateSpec:
    """How a worker turns the rows it is given into optimizer steps.

    The driver lays the rows out (:func:`rlcore.trainer.layout.mini_batch_layout`) so that
    every rank's share splits into ``mini_batches`` equal parts, one optimizer step each, for
    ``epochs`` passes. ``shuffle`` reshuffles a rank's rows every epoch (seeded by
    ``seed + step``, so a resumed run draws the same mini-batches). The LR of each step is
    :func:`rlcore.engine.learning_rate` over ``schedule_steps`` optimizer steps.
    """

    rows_per_mini_batch: int  # mini-batch size in rows over all ranks (prompts × n)
    mini_batches: int
    epochs: int
    shuffle: bool
    seed: int
    optim: OptimConfig
    schedule_steps: int
    # Rows of a mini-batch go to ranks by token count, not contiguously (layout.py).
    balance_tokens: bool = False


@attrs.frozen(kw_only=True)
class EngineRole:
    """An engine to build: which plugin, and the model it trains."""

    engine: Component
    spec: EngineSpec


@attrs.frozen(kw_only=True)
class AgentSpec:
    """The agent loop the policy worker runs instead of one ``generate`` (``[agent]``).

    ``tools``: one component per tool plugin; ``tokenizer_path`` decodes model turns (to
    find calls) and encodes tool turns.
    """

    config: AgentConfig
    tools: tuple[Component, ...]
    tokenizer_path: str
    trust_remote_code: bool = False
    # [agent] harness / environment (issue 46): the harness loop replaces the built-in one.
    harness: Component | None = None
    environment: Component | None = None


@attrs.frozen(kw_only=True)
class PolicySpec:
    """The policy worker: actor (+ reference) engine, rollout, and the loss's algorithm.

    ``temperature``: the log-prob temperature of every pass (training sampling's, 1.0 when
    greedy). ``with_entropy``: the policy loss needs the entropy with gradient.
    ``rollout_spec.seed`` is the run seed; the worker offsets it by its rank.
    ``settings``: what the process applies to itself first (timeouts, padding, plugins).
    """

    backend: str
    actor: EngineRole
    ref: EngineRole | None
    rollout: Component
    rollout_spec: RolloutSpec
    algorithm: Component
    update: UpdateSpec
    temperature: float
    with_entropy: bool
    agent: AgentSpec | None = None  # None: single-turn generate
    # Issue 16's levers (rlcore.roles.levers), decided here from config and algorithm.
    reuse_old_log_probs: bool = False  # the driver skips the old-log-prob pass
    skip_zero_advantage_rows: bool = False
    settings: WorkerSettings = attrs.Factory(WorkerSettings)
    # The rollout's own pool (resources.placement.rollout), None: in this process (default).
    rollout_pool: str | None = None
    weight_sync_bucket_bytes: int = DEFAULT_WEIGHT_SYNC_BUCKET_BYTES


@attrs.frozen(kw_only=True)
class RolloutWorkerSpec:
    """A rollout worker group on a pool of its own: the rollout and, with ``[agent]``, the
    agent loop; weights arrive over the bridge (``rlcore.workers.weight_bridge``)."""

    backend: str
    pool: str
    rollout: Component
    rollout_spec: RolloutSpec
    agent: AgentSpec | None
    settings: WorkerSettings
    weight_sync_bucket_bytes: int = DEFAULT_WEIGHT_SYNC_BUCKET_BYTES


@attrs.frozen(kw_only=True)
class CriticSpec:
    """The critic worker: the value engine, and the algorithm for its value loss."""

    backend: str
    critic: EngineRole
    algorithm: Component
    update: UpdateSpec
    settings: WorkerSettings = attrs.Factory(WorkerSettings)


@attrs.frozen(kw_only=True)
class RoleSpec:
    """One extra role's worker: its engine (frozen: no optimizer) and what it computes."""

    name: str
    output_key: str  # e.g. "teacher_log_prob"
    backend: str
    engine: EngineRole
    temperature: float  # the policy's log-prob temperature: scores of the sampled distribution
    settings: WorkerSettings


@attrs.frozen(kw_only=True)
class RewardModelSpec:
    """The reward-model role (``[reward_model]``, :mod:`rlcore.roles.reward_model`): its
    frozen engine (``reward_head``), and how the policy's rows become its inputs.

    ``retokenize``: ``auto``, ``always`` or ``never`` (:func:`rlcore.reward.model.rm_inputs`);
    ``policy_tokenizer_path`` decodes the policy's tokens when re-tokenising.
    """

    backend: str
    engine: EngineRole
    policy_tokenizer_path: str
    policy_trust_remote_code: bool
    retokenize: str
    max_length: int | None
    settings: WorkerSettings


@attrs.frozen(kw_only=True)
class GenerationRoleSpec:
    """One generation role's worker: its rollout (plugin and spec) and tokenizer settings."""

    name: str
    backend: str
    rollout: Component
    rollout_spec: RolloutSpec
    apply_chat_template: bool
    settings: WorkerSettings = attrs.Factory(WorkerSettings)
