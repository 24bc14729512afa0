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
- ``trainer.resume`` given as a path: a complete checkpoint.

The datasets are built exactly as the trainer builds them (:func:`rlcore.data.build_datasets`),
so what passes here loads there; :class:`Preflight` hands them back for the trainer to reuse
(tokenizing GSM8K-sized data takes seconds on two cores).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.errors import ConfigError, DataError

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.data import PromptDataset
    from rlcore.plugins import PluginRegistry

log = logging.getLogger(__name__)

__all__ = ["Preflight", "check_model_folder", "check_tokenizer", "preflight"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def check_model_folder(path: str, key: str) -> None:
    """A local Hugging Face model folder: ``config.json`` and weights. ``key`` names the field."""
    folder = Path(path)
    if not folder.exists():
        msg = f"{key}: {folder} does not exist; give a local Hugging Face model folder"
        raise ConfigError(msg)
    if not folder.is_dir():
        msg = f"{key}: {folder} is not a folder; give a local Hugging Face model folder"
        raise ConfigError(msg)
    config = folder / "config.json"
    if not config.is_file():
        msg = f"{key}: {folder} has no config.json; it is not a Hugging Face model folder"
        raise ConfigError(msg)
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        msg = f"{key}: {config} is not valid JSON ({err})"
        raise ConfigError(msg) from err
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    if not weights:
        msg = (
            f"{key}: {folder} has no weights (*.safetensors or pytorch_model*.bin); "
            "download or save the model there"
        )
        raise ConfigError(msg)


def check_tokenizer(path: str, *, chat_template: bool) -> Any:
    """Load the tokenizer at ``path``; with ``chat_template`` it must carry one."""
    from rlcore.data import load_tokenizer

    key = "model.tokenizer_path"
    folder = Path(path)
    if not folder.is_dir():
        msg = f"{key}: {folder} does not exist; give the folder holding the tokenizer files"
        raise ConfigError(msg)
    # transformers builds an empty tokenizer from a model folder without tokenizer files:
    # every prompt would then encode to zero tokens.
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        msg = (
            f"{key}: {folder} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); "
            "save the tokenizer there or set model.tokenizer_path"
        )
        raise ConfigError(msg)
    try:
        tokenizer = load_tokenizer(folder, require_chat_template=False)
    except DataError as err:
        msg = f"{key}: {err}"
        raise ConfigError(msg) from err
    if chat_template and not getattr(tokenizer, "chat_template", None):
        msg = (
            f"{key}: the tokenizer in {folder} has no chat template; add one "
            "(chat_template.jinja) or set data.apply_chat_template = false for plain-text prompts"
        )
        raise ConfigError(msg)
    return tokenizer


def _needs_critic(config: RunConfig, registry: PluginRegistry) -> bool:
    from rlcore.components import Component

    section = config.algorithm
    component = Component(
        kind="algorithm", name=section.name, options=section.options, where="[algorithm]"
    )
    return bool(component.build(registry=registry).needs_critic)


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

    registry = registry if registry is not None else default_registry()
    check_model_folder(config.model.path, "model.path")
    critic_path = config.critic.model_path
    if (
        critic_path is not None
        and os.path.abspath(critic_path) != os.path.abspath(config.model.path)
        and _needs_critic(config, registry)
    ):
        check_model_folder(critic_path, "critic.model_path")
    tokenizer = check_tokenizer(
        config.model.tokenizer_path or config.model.path,
        chat_template=config.data.apply_chat_template,
    )

    from rlcore.data.build import build_datasets
    from rlcore.preflight_checks import check_inputs  # headers, shapes, rows, seeds, env, run dir

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
        from rlcore.resume_check import check_resume_compatible

        check_resume_compatible(config, found)
    log.info(
        "preflight ok: model %s, %d train / %d validation prompts",
        config.model.path,
        train,
        len(val_set) if val_set is not None else 0,
    )
    return Preflight(tokenizer=tokenizer, train_set=train_set, val_set=val_set)
