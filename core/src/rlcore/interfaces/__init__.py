"""The contracts every engine, rollout, reward and algorithm plugin implements.

Each base class is a real :class:`abc.ABC` with few abstract methods, and owns a nested attrs
``Config`` holding the options of its own TOML section. A plugin subclasses both::

    class MyEngine(BaseEngine):
        @attrs.frozen(kw_only=True)          # re-apply: attrs does not inherit kw_only
        class Config(BaseEngine.Config):
            reshard_after_forward: bool = True

        def __init__(self, spec: EngineSpec, config: MyEngine.Config) -> None: ...

The core builds ``Config`` from the plugin's section (``[actor.engine]`` minus ``name``) with
extra keys forbidden, so a typo is reported with its key path before anything starts.

Tensor conventions (verl's names, so verl code ports). ``B`` is the number of rows, ``P`` the
(left-padded) prompt length, ``R`` the response length (``max_new_tokens``, right-padded):

- ``prompts`` (B, P), ``responses`` (B, R), ``input_ids`` = cat(prompts, responses) (B, P+R)
- ``attention_mask`` (B, P+R), ``position_ids`` (B, P+R), ``response_mask`` (B, R) float/int 0-1
- ``old_log_probs``, ``ref_log_prob``, ``values``, ``token_level_scores``,
  ``token_level_rewards``, ``advantages``, ``returns``: all (B, R), aligned with ``responses``
- ``non_tensor_batch["uid"]``: the prompt's id, shared by its ``n`` samples (group key)

Rows are expanded once, on the driver: each prompt is repeated ``rollout.n`` times
(interleaved, same ``uid``) before anything is dispatched, so every plugin sees one row per
sample and a rollout returns exactly one response per input row.

Everything a plugin needs for a call is an argument of that call (temperature, entropy with
gradient, the learning rate); nothing travels in ``DataProto.meta_info`` as a side channel.
The only ``meta_info`` keys the core uses are:

- ``meta_info["metrics"]``: set by a worker method on the DataProto it returns (a dict of
  metric name -> float or list of floats); ``DataProto.concat`` merges the ranks' dicts and
  the driver reduces them. Engines, rollouts and algorithms never read it.
- ``meta_info["epoch"]``: set by the prompt loader on each training batch (the epoch it came
  from); the driver logs it as ``training/epoch``. Plugins never see it.

Capabilities are declared, not probed: an algorithm says what it needs
(:attr:`BaseAlgorithm.needs`, an :class:`AlgorithmNeeds`) and a rollout what it is
(:meth:`BaseRollout.traits`, a :class:`RolloutTraits`, and :meth:`BaseRollout.dispatch_info`);
the core reads only those. The contract is versioned (:data:`CONTRACT_VERSION`, what each
version changed in :data:`CONTRACT_CHANGES`): every plugin module declares the version it was
written for (``contract_version = 2`` at module level) and discovery refuses an older one with
one line naming the change (migration notes: ``core/README.md``, "Contract versions").

One module per contract, all re-exported here (import from ``rlcore.interfaces``; the
modules are where each is written, not a second API):
``engine`` (:class:`BaseEngine`), ``rollout`` (:class:`BaseRollout`), ``reward``
(:class:`BaseReward`, :class:`BaseBatchReward`), ``algorithm`` (:class:`BaseAlgorithm`), ``tool``
(:class:`BaseTool`), ``logger`` (:class:`BaseLogger`), ``harness`` (:class:`BaseHarness`),
``environment`` (:class:`BaseEnvironment`); what they exchange in ``specs``, what a
plugin declares in ``declarations``, :func:`key` in ``config_key`` and the version in
``version``.

This package imports neither torch nor plugins, so discovery stays light.
"""

from __future__ import annotations

from rlcore.interfaces.algorithm import BaseAlgorithm
from rlcore.interfaces.config_key import POLL_MAX_S, WAIT_MAX_S, key, seconds
from rlcore.interfaces.declarations import (
    ROLE_COMPUTES,
    AlgorithmNeeds,
    ExtraRole,
    GenerationRole,
    RolloutTraits,
)
from rlcore.interfaces.engine import BaseEngine
from rlcore.interfaces.environment import BaseEnvironment
from rlcore.interfaces.harness import BaseHarness, HarnessResult, HarnessTask
from rlcore.interfaces.logger import BaseLogger, RunInfo
from rlcore.interfaces.reward import BaseBatchReward, BaseReward, BatchScores, RewardBatch
from rlcore.interfaces.rollout import BaseRollout
from rlcore.interfaces.specs import (
    DTYPE_NAMES,
    BatchTotals,
    Device,
    Dtype,
    EngineSpec,
    GenerationResult,
    LossFn,
    ModelOutputs,
    OptimConfig,
    RolloutSpec,
    SamplingParams,
    TokenDistributions,
)
from rlcore.interfaces.tool import BaseTool, ToolError
from rlcore.interfaces.version import CONTRACT_CHANGES, CONTRACT_NOTE, CONTRACT_VERSION

__all__ = [
    "CONTRACT_CHANGES",
    "CONTRACT_NOTE",
    "CONTRACT_VERSION",
    "DTYPE_NAMES",
    "POLL_MAX_S",
    "ROLE_COMPUTES",
    "WAIT_MAX_S",
    "AlgorithmNeeds",
    "BaseAlgorithm",
    "BaseBatchReward",
    "BaseEngine",
    "BaseEnvironment",
    "BaseHarness",
    "BaseLogger",
    "BaseReward",
    "BaseRollout",
    "BaseTool",
    "BatchScores",
    "BatchTotals",
    "Device",
    "Dtype",
    "EngineSpec",
    "ExtraRole",
    "GenerationResult",
    "GenerationRole",
    "HarnessResult",
    "HarnessTask",
    "LossFn",
    "ModelOutputs",
    "OptimConfig",
    "RewardBatch",
    "RolloutSpec",
    "RolloutTraits",
    "RunInfo",
    "SamplingParams",
    "TokenDistributions",
    "ToolError",
    "key",
    "seconds",
]
