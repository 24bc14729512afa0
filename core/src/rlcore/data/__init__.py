"""Prompt data: datasets from parquet/jsonl in verl's schema, a resumable dataloader, and
building both from a run config (:mod:`rlcore.data.build`).

torch and transformers are imported only when a batch is built or a tokenizer is loaded.
"""

from __future__ import annotations

from rlcore.data.build import build_datasets, build_loaders
from rlcore.data.dataset import PromptDataset, load_tokenizer, read_rows
from rlcore.data.loader import PromptDataLoader, collate_prompts

__all__ = [
    "PromptDataLoader",
    "PromptDataset",
    "build_datasets",
    "build_loaders",
    "collate_prompts",
    "load_tokenizer",
    "read_rows",
]
