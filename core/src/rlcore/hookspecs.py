"""The hooks a plugin distribution implements to register components with rlcore.

A plugin is a module named by an entry point in the ``rlcore`` group::

    [project.entry-points.rlcore]
    fsdp2 = "rlcore_fsdp2.plugin"

whose functions carry ``@hookimpl``. Hooks return data and do no work: each maps a name, as
it appears in a TOML config, to a ``"module:Class"`` string (imported only when a config
selects that name) or to the class itself (policy losses and advantage estimators are
functions: ``"module:function"``). A plugin module must import nothing heavy
(no torch, transformers, vllm, ...), because every installed plugin is imported whenever
rlcore lists or resolves plugins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pluggy

PROJECT_NAME = "rlcore"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_engines() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Training engines (subclasses of :class:`rlcore.interfaces.BaseEngine`).

    Selected by ``[actor.engine] name = ...`` (also ``[critic.engine]``, ``[ref.engine]``).

    Example::

        @hookimpl
        def register_engines():
            return {"fsdp2": "rlcore_fsdp2.engine:FSDP2Engine"}
    """


@hookspec
def register_rollouts() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Generation backends (subclasses of :class:`rlcore.interfaces.BaseRollout`).

    Selected by ``[rollout] name = ...``.

    Example::

        @hookimpl
        def register_rollouts():
            return {"hf": "rlcore_hf.rollout:HFRollout"}
    """


@hookspec
def register_rewards() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Reward functions (subclasses of :class:`rlcore.interfaces.BaseReward`).

    Selected by ``[reward] default = ...`` and the ``[reward.sources]`` map.

    Example::

        @hookimpl
        def register_rewards():
            return {"gsm8k": "rlcore_gsm8k.reward:GSM8KReward"}
    """


@hookspec
def register_algorithms() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """RL algorithms (subclasses of :class:`rlcore.interfaces.BaseAlgorithm`).

    Selected by ``[algorithm] name = ...``.

    Example::

        @hookimpl
        def register_algorithms():
            return {"grpo": "rlcore_grpo.algorithm:GRPO"}
    """


@hookspec
def register_tools() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Tools a multi-turn agent may call (subclasses of :class:`rlcore.agent.BaseTool`).

    Selected by ``[agent] tools = [...]``.

    Example::

        @hookimpl
        def register_tools():
            return {"calculator": "rlcore_calculator.tool:CalculatorTool"}
    """


@hookspec
def register_harnesses() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Agent harnesses run behind the OpenAI-compatible endpoint (subclasses of
    :class:`rlcore.interfaces.BaseHarness`).

    Selected by ``[agent] harness = ...``.

    Example::

        @hookimpl
        def register_harnesses():
            return {"openai_calculator": "rlcore_calculator.harness:OpenAICalculatorHarness"}
    """


@hookspec
def register_environments() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Environments with ``reset``/``step`` (subclasses of
    :class:`rlcore.interfaces.BaseEnvironment`).

    Selected by ``[agent] environment = ...``.

    Example::

        @hookimpl
        def register_environments():
            return {"arithmetic": "rlcore_calculator.environment:ArithmeticEnvironment"}
    """


@hookspec
def register_loggers() -> Mapping[str, str | type]:  # type: ignore[empty-body]
    """Experiment trackers (subclasses of :class:`rlcore.interfaces.BaseLogger`).

    Selected by ``[trainer] loggers = [...]``; options in ``[trainer.logger_options.NAME]``.
    The core's own ``console``, ``jsonl`` and ``tensorboard`` are registered the same way.

    Example::

        @hookimpl
        def register_loggers():
            return {"wandb": "rlcore_wandb.logger:WandbLogger"}
    """


@hookspec
def register_policy_losses() -> Mapping[str, str | Callable[..., Any]]:  # type: ignore[empty-body]
    """Policy losses (functions of :class:`rlcore.rl.registry.PolicyLossFn`'s signature).

    Selected by ``[algorithm] policy_loss = ...`` (algorithms built on
    :class:`rlcore.rl.algorithm.PolicyGradientAlgorithm`). Targets are ``"module:function"``
    strings; :func:`rlcore.rl.losses.policy_loss_fn` turns per-token terms into one with the
    shared aggregation and metrics.

    Example::

        @hookimpl
        def register_policy_losses():
            return {"my_clip": "acme_rl.losses:compute_policy_loss_my_clip"}
    """


@hookspec
def register_adv_estimators() -> Mapping[str, str | Callable[..., Any]]:  # type: ignore[empty-body]
    """Advantage estimators (functions of :class:`rlcore.rl.registry.AdvantageEstimatorFn`'s
    signature).

    Selected by ``[algorithm] adv_estimator = ...`` (verl's key; algorithms built on
    :class:`rlcore.rl.algorithm.PolicyGradientAlgorithm`, each with its own default).

    Example::

        @hookimpl
        def register_adv_estimators():
            return {"my_baseline": "acme_rl.advantages:compute_my_baseline_advantage"}
    """
