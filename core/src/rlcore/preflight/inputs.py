"""More checks before Ray starts, each one line naming the key or file and the fix.

Called by :func:`rlcore.preflight.preflight` once the model folder and the tokenizer passed
(:mod:`rlcore.preflight.model`; :func:`check_inputs` runs its weight-file checks too):

- data rows: chat prompts are non-empty lists of ``{"role": str, "content": str}``; a plain
  prompt (``data.apply_chat_template = false``) is not empty;
- ``data.seed`` and ``trainer.seed`` within ``[0, 2**32)`` (what numpy and torch accept);
- ``trainer.run_dir`` can be created and written (and its ``checkpoints/``, when present).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.errors import ConfigError, DataError
from rlcore.preflight.model import check_model_files

if TYPE_CHECKING:
    from rlcore.config import RunConfig

__all__ = [
    "check_chat_rows",
    "check_inputs",
    "check_run_dir",
    "check_seeds",
]

SEED_LIMIT = 2**32


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
