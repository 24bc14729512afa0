"""More checks before Ray starts, each one line naming the key or file and the fix.

Called by :func:`rlcore.preflight.preflight` once the model folder and the tokenizer passed:

- weights: every ``*.safetensors`` of ``model.path`` (and a separate ``critic.model_path``) has
  a complete header and data (a 0-byte or truncated download is named), every file a
  ``model.safetensors.index.json`` lists exists; read from the headers only, nothing loaded;
- ``config.json`` names a ``model_type``, and its ``vocab_size`` / ``hidden_size`` agree with
  the embedding matrix in the weights; the model's vocabulary holds every tokenizer id;
- data rows: chat prompts are non-empty lists of ``{"role": str, "content": str}``; a plain
  prompt (``data.apply_chat_template = false``) is not empty;
- ``data.seed`` and ``trainer.seed`` within ``[0, 2**32)`` (what numpy and torch accept);
- environment variables rlcore reads (``RLCORE_COLLECTIVE_TIMEOUT_S``, ``RLCORE_MAX_GRAD_NORM``,
  ``RLCORE_HEARTBEAT_TIMEOUT_S``, ``RLCORE_NUM_THREADS``, ``OMP_NUM_THREADS``);
- ``trainer.run_dir`` can be created and written (and its ``checkpoints/``, when present).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.errors import ConfigError, DataError

if TYPE_CHECKING:
    from rlcore.config import RunConfig

__all__ = [
    "check_chat_rows",
    "check_environment",
    "check_inputs",
    "check_model_files",
    "check_run_dir",
    "check_seeds",
    "read_safetensors_header",
]

SEED_LIMIT = 2**32
_HEADER_LIMIT = 100 * 2**20  # safetensors caps its JSON header at 100 MB
_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


def read_safetensors_header(file: Path, key: str) -> dict[str, Any]:
    """The JSON header of a safetensors file, after checking the file holds all its data."""
    try:
        size = file.stat().st_size
        with file.open("rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            raw = fh.read(n) if 0 < n <= _HEADER_LIMIT else b""
    except OSError as err:
        msg = f"{key}: cannot read {file} ({err.strerror or err})"
        raise ConfigError(msg) from err
    fix = "download or save the model again"
    if size < 8 or n <= 0 or n > _HEADER_LIMIT or len(raw) < n:
        msg = f"{key}: {file} is not a complete safetensors file ({size} bytes); {fix}"
        raise ConfigError(msg)
    try:
        header = json.loads(raw)
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        msg = f"{key}: {file} has a damaged safetensors header ({type(err).__name__}); {fix}"
        raise ConfigError(msg) from err
    need = 8 + n + max(ends, default=0)
    if size < need:
        msg = f"{key}: {file} is truncated ({size} bytes, its header describes {need}); {fix}"
        raise ConfigError(msg)
    return dict(header)


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


def check_chat_rows(files: tuple[str, ...], key: str, prompt_key: str, chat: bool) -> None:
    """Chat prompts are non-empty lists of string messages; plain prompts are not empty."""
    from rlcore.data import read_rows

    for file in files:
        try:
            rows = read_rows(file)
        except DataError:
            return  # the dataset build reports it, with its own wording
        for i, row in enumerate(rows):
            prompt: Any = row.get(prompt_key)
            if hasattr(prompt, "tolist"):
                prompt = prompt.tolist()
            where = f"{key}: {file} row {i}: column {prompt_key!r}"
            if isinstance(prompt, str):
                if not chat and not prompt.strip():
                    msg = f"{where} is an empty prompt; remove the row or write the prompt"
                    raise DataError(msg)
                continue
            if not isinstance(prompt, list):
                continue  # a missing column: the dataset build names it
            if not prompt:
                msg = f"{where} is an empty list of messages; give at least one message"
                raise DataError(msg)
            for j, message in enumerate(prompt):
                if not isinstance(message, dict):
                    continue  # reported by the dataset build
                for field in ("role", "content"):
                    value = message.get(field)
                    if field in message and not isinstance(value, str):
                        shown = "null" if value is None else json.dumps(value, default=str)
                        msg = f"{where} message {j}: {field} must be a string, got {shown}"
                        raise DataError(msg)


def check_seeds(config: RunConfig) -> None:
    for key, seed in (("data.seed", config.data.seed), ("trainer.seed", config.trainer.seed)):
        if not 0 <= seed < SEED_LIMIT:
            msg = f"{key}: must be between 0 and 2**32 - 1 (4294967295), got {seed}"
            raise ConfigError(msg)


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Every environment variable rlcore reads, parsed now instead of in a worker."""
    from rlcore.divergence import grad_norm_ceiling
    from rlcore.liveness import heartbeat_timeout_s
    from rlcore.workers.worker import collective_timeout_s

    env = dict(os.environ if environ is None else environ)
    collective_timeout_s(env)
    grad_norm_ceiling(env)
    heartbeat_timeout_s(env)
    for name in ("RLCORE_NUM_THREADS", "OMP_NUM_THREADS"):
        raw = env.get(name, "").strip()
        if raw and not (raw.isdigit() and int(raw) >= 1):
            msg = f"{name}={raw!r}: expected a whole number of threads >= 1"
            raise ConfigError(msg)


def check_run_dir(run_dir: str) -> None:
    """``run_dir`` (and its ``checkpoints/``) can be created and written by this user."""
    folder = Path(run_dir)
    for target in (folder, folder / "checkpoints"):
        if target != folder and not target.exists():
            continue
        probe_in = (
            target
            if target.exists()
            else next((p for p in target.parents if p.exists()), Path("."))
        )
        try:
            with tempfile.TemporaryFile(dir=probe_in):
                pass
        except OSError as err:
            msg = (
                f"trainer.run_dir: cannot write to {probe_in} ({err.strerror or err}); make it "
                "writable or set another trainer.run_dir"
            )
            raise ConfigError(msg) from err


def check_inputs(config: RunConfig, tokenizer: Any, critic_path: str | None = None) -> None:
    """Everything above, in the order a user would fix it."""
    check_environment()
    check_seeds(config)
    check_model_files(config.model.path, "model.path", tokenizer)
    if critic_path is not None:
        check_model_files(critic_path, "critic.model_path")
    data = config.data
    chat = data.apply_chat_template
    check_chat_rows(data.train_files, "data.train_files", data.prompt_key, chat)
    check_chat_rows(data.val_files, "data.val_files", data.prompt_key, chat)
    if config.trainer.run_dir:
        check_run_dir(config.trainer.run_dir)
