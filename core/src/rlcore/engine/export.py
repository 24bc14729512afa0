"""What an engine's ``export_hf`` copies besides the weights: the base model's tokenizer files."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

__all__ = [
    "TOKENIZER_FILES",
    "copy_tokenizer_files",
]


# What ``export_hf`` copies from ``model_path`` next to the weights it writes.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def copy_tokenizer_files(
    source: str | Path, out: str | Path, names: Iterable[str] = TOKENIZER_FILES
) -> None:
    """Copy the files ``names`` that ``source`` (the base model folder) has into ``out``."""
    for name in names:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, Path(out) / name)
