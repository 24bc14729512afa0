"""From a run config to datasets and dataloaders: what the driver and preflight share.

:func:`build_datasets` checks each file (exists, readable, UTF-8) and builds the train and
validation :class:`PromptDataset`, with errors naming the config key; :func:`build_loaders`
wraps them in :class:`PromptDataLoader` (full, shuffled train batches; one validation pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.errors import DataError, require_file

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.data.dataset import PromptDataset
    from rlcore.data.loader import PromptDataLoader

__all__ = ["build_datasets", "build_loaders", "prompt_tools"]


def _check_file(file: str, key: str) -> None:
    path = require_file(file, "data file", error=DataError, where=key)
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except OSError as err:
        msg = f"{key}: cannot read data file {path}: {err.strerror or err}"
        raise DataError(msg) from err


def _utf8_culprit(files: tuple[str, ...]) -> tuple[str, UnicodeDecodeError] | None:
    for file in files:
        if Path(file).suffix.lower() == ".parquet":
            continue
        try:
            Path(file).read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            return file, err
    return None


def prompt_tools(config: RunConfig) -> list[dict[str, Any]]:
    """The tool descriptions the chat template renders into the prompts: those of ``[agent]
    tools`` (built with their ``[agent.options.NAME]``) when ``tool_turns`` is
    ``chat_template``; none otherwise (the data's own system prompt describes them)."""
    agent = config.agent
    if agent is None or not agent.tools or agent.turns() != "chat_template":
        return []
    from rlcore.agent.template import tool_schemas
    from rlcore.plugins import Component

    tools = [
        Component(kind="tool", name=n, options=agent.options.get(n), where="[agent] tools").build()
        for n in agent.tools
    ]
    return tool_schemas(tools)


def _build_dataset(
    config: RunConfig, tokenizer: Any, files: tuple[str, ...], key: str, name: str
) -> PromptDataset:
    """The dataset exactly as the trainer builds it (all files in one)."""
    from rlcore.data.dataset import PromptDataset

    for file in files:
        _check_file(file, key)
    data = config.data
    try:
        return PromptDataset(
            files,
            tokenizer,
            prompt_key=data.prompt_key,
            max_prompt_length=data.max_prompt_length,
            filter_overlong_prompts=data.filter_overlong_prompts,
            truncation=data.truncation,
            apply_chat_template=data.apply_chat_template,
            max_samples=data.val_max_samples if name == "val" else None,
            name=name,
            tools=prompt_tools(config),
            columns=data.columns,
        )
    except DataError as err:
        msg = f"{key}: {err}"
        raise DataError(msg) from err
    except UnicodeDecodeError as err:
        found = _utf8_culprit(files)
        file, cause = found if found is not None else (", ".join(files), err)
        msg = f"{key}: {file} is not UTF-8 text ({cause.reason} at byte {cause.start})"
        raise DataError(msg) from err


def build_datasets(config: RunConfig, tokenizer: Any) -> tuple[PromptDataset, PromptDataset | None]:
    """The train and validation sets as training uses them; errors name the config key."""
    data = config.data
    train_set = _build_dataset(config, tokenizer, data.train_files, "data.train_files", "train")
    if len(train_set) < data.train_batch_size:
        msg = (
            f"data.train_batch_size: the train set has {len(train_set)} prompts (after "
            f"filtering), fewer than one batch of {data.train_batch_size}; lower it or add data"
        )
        raise DataError(msg)
    val_set = (
        _build_dataset(config, tokenizer, data.val_files, "data.val_files", "val")
        if data.val_files
        else None
    )
    return train_set, val_set


def build_loaders(
    config: RunConfig, train_set: PromptDataset, val_set: PromptDataset | None
) -> tuple[PromptDataLoader, PromptDataLoader | None]:
    """Train loader (full batches, shuffled per epoch) and validation loader (one pass)."""
    from rlcore.data.loader import PromptDataLoader

    data = config.data
    train = PromptDataLoader(
        train_set, data.train_batch_size, shuffle=data.shuffle, seed=data.seed, drop_last=True
    )
    if val_set is None:
        return train, None
    val = PromptDataLoader(
        val_set, data.val_batch_size or len(val_set), shuffle=False, drop_last=False
    )
    return train, val
