"""Checks of the model and tokenizer folders before Ray starts, each one line naming the key
and the fix: a local Hugging Face folder with ``config.json`` and weights, tokenizer files that
load (and a chat template when one is needed), complete safetensors headers (read from the
headers only, nothing loaded), ``config.json`` against the weights and the tokenizer's
vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlcore.checkpoint.safetensors_header import read_safetensors_header
from rlcore.errors import ConfigError, DataError

__all__ = ["check_model_files", "check_model_folder", "check_tokenizer"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


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
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        msg = (
            f"{key}: {folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
            "save the tokenizer there or set model.tokenizer_path"
        )
        raise ConfigError(msg)
    try:
        return load_tokenizer(folder, require_chat_template=chat_template)
    except DataError as err:
        msg = f"{key}: {err}"
        raise ConfigError(msg) from err


_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


def check_model_files(path: str, key: str, tokenizer: Any | None = None) -> None:
    """Weights headers, ``config.json`` against the weights, vocabulary against the tokenizer."""
    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            listed = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            msg = f"{key}: {index} is unreadable ({type(err).__name__})"
            raise ConfigError(msg) from err
        for name in sorted(listed):
            if not (folder / str(name)).is_file():
                msg = f"{key}: {folder / str(name)} is missing (listed in {index.name})"
                raise ConfigError(msg)
    shapes: dict[str, list[int]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        header = read_safetensors_header(file, key)
        for name, info in header.items():
            if name != "__metadata__" and isinstance(info, dict):
                shapes[name] = list(info.get("shape") or [])
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))  # valid JSON: checked before
    if not isinstance(config, dict) or not config.get("model_type"):
        msg = f"{key}: {config_file} names no model_type; it is not a transformers model config"
        raise ConfigError(msg)
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    embedding = next(
        ((n, s) for n, s in shapes.items() if n.endswith(_EMBEDDING_SUFFIXES) and len(s) == 2),
        None,
    )
    if embedding is not None and isinstance(vocab, int) and isinstance(hidden, int):
        name, shape = embedding
        if shape != [vocab, hidden]:
            msg = (
                f"{key}: {config_file} says vocab_size={vocab}, hidden_size={hidden} but the "
                f"weights hold {name} of shape {shape}; the config and the weights are from "
                "different models"
            )
            raise ConfigError(msg)
    if tokenizer is not None and isinstance(vocab, int) and len(tokenizer) > vocab:
        msg = (
            f"{key}: the model's vocab_size ({vocab}) is smaller than the tokenizer's "
            f"{len(tokenizer)} tokens; use the tokenizer saved with this model "
            "(model.tokenizer_path)"
        )
        raise ConfigError(msg)
