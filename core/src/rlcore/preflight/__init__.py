"""Checks of a run's files before anything starts: one line naming the key and the fix.

:func:`preflight` runs after the config validated and before Ray starts, so that a wrong path
or a bad data file costs a second, not a cluster start-up and a model load. It checks:

- ``model.path`` (and ``critic.model_path`` when the algorithm trains a critic on another
  model): a folder with ``config.json`` (valid JSON) and weights (``*.safetensors`` or
  ``pytorch_model*.bin``);
- ``model.tokenizer_path``: tokenizer files that load, and a chat template when
  ``data.apply_chat_template``;
- ``data.train_files`` / ``data.val_files``: each file exists, is readable, parses
  (``.parquet``/``.jsonl``), has rows with ``prompt`` (``data.prompt_key``), ``data_source``
  and ``reward_model.ground_truth``, and not every prompt is longer than
  ``data.max_prompt_length`` (over-long ones are filtered with a logged count, as in training);
  the training set holds at least one batch;
- ``trainer.resume`` given as a path: a complete checkpoint;
- ``[resources.pools]`` on a private local Ray: the pools together fit this machine's CPUs
  (and GPUs), :func:`rlcore.workers.cluster.check_local_pools`.

``rlcore train`` then runs the selected engines' and rollout's own checks
(:func:`rlcore.trainer.plugin_checks.check_plugins`), also before Ray starts.

The datasets are built exactly as the trainer builds them (:func:`rlcore.data.build_datasets`),
so what passes here loads there; :class:`Preflight` hands them back for the trainer to reuse
(tokenizing GSM8K-sized data takes seconds on two cores).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.preflight.model import check_model_files, check_model_folder, check_tokenizer

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.data import PromptDataset
    from rlcore.interfaces import AlgorithmNeeds
    from rlcore.plugins import PluginRegistry

log = logging.getLogger(__name__)

__all__ = ["Preflight", "check_model_files", "check_model_folder", "check_tokenizer", "preflight"]


def _needs(config: RunConfig, registry: PluginRegistry) -> AlgorithmNeeds:
    from rlcore.plugins import Component

    section = config.algorithm
    component = Component(
        kind="algorithm", name=section.name, options=section.options, where="[algorithm]"
    )
    needs: AlgorithmNeeds = component.build(registry=registry).needs
    return needs


@attrs.frozen(kw_only=True)
class Preflight:
    """What the checks loaded; the trainer may reuse it instead of tokenizing again."""

    tokenizer: Any
    train_set: PromptDataset
    val_set: PromptDataset | None


def preflight(config: RunConfig, *, registry: PluginRegistry | None = None) -> Preflight:
    """Check the model, tokenizer, data files and resume path of ``config`` (see module doc).

    Raises a :class:`~rlcore.errors.RlcoreError` whose one-line message names the key.
    Returns the tokenizer and the datasets, built exactly as the trainer builds them.
    """
    from rlcore.checkpoint import CHECKPOINTS_DIR, CheckpointManager, find_checkpoint
    from rlcore.plugins import default_registry
    from rlcore.preflight.hub import resolve_hub_names

    config = resolve_hub_names(config)  # the one place Hub names become local folders
    registry = registry if registry is not None else default_registry(config.plugins.disabled)
    check_model_folder(config.model.path, "model.path")
    needs = _needs(config, registry)
    critic_path = config.critic.model_path
    if (
        critic_path is not None
        and os.path.abspath(critic_path) != os.path.abspath(config.model.path)
        and needs.critic
    ):
        check_model_folder(critic_path, "critic.model_path")
    from rlcore.preflight.roles import check_extra_roles, check_placed_roles, check_reward_roles

    check_extra_roles(config, needs.extra_roles)
    judges = check_reward_roles(config, registry)  # a judge's model folder
    check_placed_roles(config, needs.extra_roles, judges)  # resources.placement's roles exist
    from rlcore.preflight.reward_model import check_reward_model

    check_reward_model(config)  # [reward_model]: its folder, a sequence classifier
    from rlcore.workers.cluster import check_pools_before_ray

    check_pools_before_ray(config.resources)  # [resources.pools] fit this machine
    tokenizer = check_tokenizer(
        config.model.tokenizer_path,
        chat_template=config.data.apply_chat_template,
    )

    from rlcore.data.build import build_datasets
    from rlcore.preflight.inputs import check_inputs  # headers, shapes, rows, seeds, env, run dir

    check_inputs(config, tokenizer)
    train_set, val_set = build_datasets(config, tokenizer)
    train = len(train_set)

    resume = config.trainer.resume
    found = None
    if resume not in ("auto", "off"):
        found = find_checkpoint(resume, key="trainer.resume")
    elif resume == "auto" and config.trainer.run_dir:  # a crafted or damaged one, before Ray
        found = CheckpointManager(Path(config.trainer.run_dir) / CHECKPOINTS_DIR).latest()
    if found is not None:  # the same model and optimizer settings, or one line naming keys
        from rlcore.checkpoint.resume_check import check_finite_weights, check_resume_compatible

        check_resume_compatible(config, found)
        if config.trainer.check_finite_on_resume:
            check_finite_weights(found)
    log.info(
        "preflight ok: model %s, %d train / %d validation prompts",
        config.model.path,
        train,
        len(val_set) if val_set is not None else 0,
    )
    return Preflight(tokenizer=tokenizer, train_set=train_set, val_set=val_set)
