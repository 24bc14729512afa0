"""Prompt datasets from parquet or jsonl files in verl's row schema.

A row looks like verl's preprocessed GSM8K::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "Natalia sold clips ..."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0}}

The chat template is applied once, at load time, and prompts longer than
``max_prompt_length`` tokens are dropped (with a logged count) or rejected. Only token ids and
the per-row fields the reward needs are kept, so a dataset of GSM8K's size costs a few MB.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rlcore.errors import DataError, require_file

log = logging.getLogger(__name__)

__all__ = ["PromptDataset", "load_tokenizer", "read_rows"]

Truncation = Literal["error", "left", "right"]


def load_tokenizer(path: str | os.PathLike[str], *, require_chat_template: bool = True) -> Any:
    """Load a Hugging Face tokenizer from a local folder (transformers imported here, lazily).

    Raises DataError naming ``path`` when the folder has no tokenizer or, with
    ``require_chat_template``, when the tokenizer has no chat template. A tokenizer without a
    pad token gets its eos token as pad (prompts are left-padded with it, masked out).
    """
    folder = Path(path)
    if not folder.exists():
        msg = f"tokenizer folder {folder} does not exist (set [model] path to a local HF folder)"
        raise DataError(msg)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        msg = f"no tokenizer could be loaded from {folder}: {err}"
        raise DataError(msg) from err
    if len(tokenizer) == 0 or not tokenizer.encode("a", add_special_tokens=False):
        # transformers builds an empty tokenizer from a folder without tokenizer files rather
        # than failing; every prompt would silently become zero tokens.
        msg = f"no tokenizer files in {folder} (expected tokenizer.json or tokenizer_config.json)"
        raise DataError(msg)
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        # The one wording of this error: preflight (check_tokenizer) prefixes its key.
        msg = (
            f"the tokenizer in {folder} has no chat template; add one (chat_template.jinja) "
            "or set data.apply_chat_template = false for plain-text prompts"
        )
        raise DataError(msg)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All rows of one ``.parquet`` or ``.jsonl`` (``.json`` lines) file as dicts."""
    file = require_file(path, "data file", error=DataError)
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows: list[dict[str, Any]] = pq.read_table(file).to_pylist()
        except (OSError, ValueError) as err:
            msg = f"cannot read parquet file {file}: {err}"
            raise DataError(msg) from err
        return rows
    if suffix in (".jsonl", ".json"):
        rows = []
        try:
            with file.open(encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as err:
                        msg = f"{file}:{lineno}: not a JSON object per line: {err.msg}"
                        raise DataError(msg) from err
                    if not isinstance(row, dict):
                        msg = f"{file}:{lineno}: expected a JSON object, got {type(row).__name__}"
                        raise DataError(msg)
                    rows.append(row)
        except UnicodeDecodeError as err:
            msg = f"{file} is not UTF-8 text ({err.reason} at byte {err.start})"
            raise DataError(msg) from err
        except OSError as err:
            msg = f"cannot read {file}: {err.strerror or err}"
            raise DataError(msg) from err
        return rows
    msg = f"data file {file}: unsupported extension {suffix!r} (use .parquet or .jsonl)"
    raise DataError(msg)


class PromptDataset:
    """Tokenized prompts plus the per-row fields the reward and the metrics need.

    ``files``: one or more ``.parquet``/``.jsonl`` paths, concatenated in order.
    ``tokenizer``: a Hugging Face tokenizer (see :func:`load_tokenizer`).
    ``prompt_key``: the column holding chat messages (``[{"role", "content"}]``) or a string;
    a string is wrapped as one user message when ``apply_chat_template`` is true.
    ``max_prompt_length``: in tokens, after the chat template. Longer prompts are dropped when
    ``filter_overlong_prompts`` (the count is logged); otherwise ``truncation`` decides:
    ``"error"`` raises, ``"left"`` keeps the end of the prompt, ``"right"`` its start.
    ``max_samples``: keep only the first N rows (after filtering), e.g. a quick validation set.
    ``columns``: a :class:`~rlcore.config.schema.ColumnsConfig` mapping the files' own
    columns onto the prompt, ``reward_model.ground_truth`` and ``data_source``.
    ``tools``: OpenAI-style tool descriptions the chat template renders into every prompt
    (``[agent] tool_turns = "chat_template"``; :func:`rlcore.agent.template.tool_schemas`).
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int,
        filter_overlong_prompts: bool = True,
        truncation: Truncation = "error",
        apply_chat_template: bool = True,
        max_samples: int | None = None,
        name: str = "train",
        tools: Sequence[Mapping[str, Any]] = (),
        columns: Any = None,
    ) -> None:
        if max_prompt_length <= 0:
            msg = f"max_prompt_length must be > 0, got {max_prompt_length}"
            raise DataError(msg)
        paths = [files] if isinstance(files, str | os.PathLike) else list(files)
        if not paths:
            msg = f"no data files given for the {name} set"
            raise DataError(msg)
        if apply_chat_template and not getattr(tokenizer, "chat_template", None):
            msg = f"the tokenizer has no chat template but the {name} set asks to apply one"
            raise DataError(msg)
        self.name = name
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] or None  # the chat template's ``tools``
        self.columns = columns if columns is not None and columns.active() else None
        self.max_prompt_length = max_prompt_length
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else None
        if pad is None:
            pad = tokenizer.eos_token_id
        if pad is None:
            msg = "the tokenizer has neither a pad token nor an eos token to pad prompts with"
            raise DataError(msg)
        self.pad_token_id: int = int(pad)

        self.input_ids: list[list[int]] = []
        self.raw_prompts: list[Any] = []
        self.data_sources: list[str] = []
        self.reward_models: list[dict[str, Any]] = []
        self.extra_infos: list[dict[str, Any]] = []
        self.indices: list[Any] = []
        for path in paths:
            self._load_file(
                Path(path),
                prompt_key=prompt_key,
                filter_overlong=filter_overlong_prompts,
                truncation=truncation,
                apply_chat_template=apply_chat_template,
            )
        if max_samples is not None and max_samples < len(self.input_ids):
            for column in self._columns():
                del column[max_samples:]
        log.info("%s set: %d prompts from %s", name, len(self), ", ".join(map(str, paths)))

    def _columns(self) -> list[list[Any]]:
        return [
            self.input_ids,
            self.raw_prompts,
            self.data_sources,
            self.reward_models,
            self.extra_infos,
            self.indices,
        ]

    def _load_file(
        self,
        path: Path,
        *,
        prompt_key: str,
        filter_overlong: bool,
        truncation: Truncation,
        apply_chat_template: bool,
    ) -> None:
        rows = read_rows(path)
        if not rows:
            msg = f"data file {path} has no rows"
            raise DataError(msg)
        if self.columns is not None:
            rows = [_mapped(row, self.columns, prompt_key, path, i) for i, row in enumerate(rows)]
        texts: list[str] = []
        for i, row in enumerate(rows):
            _check_row(row, i, path, prompt_key)
            prompt = row[prompt_key]
            if apply_chat_template:
                messages = _as_messages(prompt, path, i, prompt_key)
                texts.append(
                    self.tokenizer.apply_chat_template(
                        messages, tools=self.tools, add_generation_prompt=True, tokenize=False
                    )
                )
            elif isinstance(prompt, str):
                texts.append(prompt)
            else:
                msg = (
                    f"{path} row {i}: column {prompt_key!r} holds chat messages but "
                    "apply_chat_template is false; give plain strings or enable the template"
                )
                raise DataError(msg)
        # The template already wrote any special tokens; adding them again would double BOS.
        encoded: list[list[int]] = self.tokenizer(texts, add_special_tokens=False)["input_ids"]

        limit = self.max_prompt_length
        n_over = sum(len(ids) > limit for ids in encoded)
        if n_over and not filter_overlong and truncation == "error":
            first = next(i for i, ids in enumerate(encoded) if len(ids) > limit)
            msg = (
                f"{path} row {first}: prompt has {len(encoded[first])} tokens, more than "
                f"max_prompt_length={limit} ({n_over} such rows); set filter_overlong_prompts "
                "= true, raise max_prompt_length, or choose a truncation"
            )
            raise DataError(msg)
        if n_over and filter_overlong:
            if n_over == len(encoded):
                msg = (
                    f"all {len(encoded)} prompts in {path} are longer than "
                    f"max_prompt_length={limit} tokens; raise max_prompt_length"
                )
                raise DataError(msg)
            log.warning(
                "filtered %d of %d prompts longer than %d tokens from %s",
                n_over,
                len(encoded),
                limit,
                path.name,
            )
        elif n_over:  # truncated as data.truncation says: counted, as the filtered ones are
            log.warning(
                "truncated %d of %d prompts longer than %d tokens from %s (data.truncation = %s)",
                n_over,
                len(encoded),
                limit,
                path.name,
                truncation,
            )
        for i, (row, ids) in enumerate(zip(rows, encoded)):
            if len(ids) > limit:
                if filter_overlong:
                    continue
                ids = ids[-limit:] if truncation == "left" else ids[:limit]
            extra = row.get("extra_info") or {}
            self.input_ids.append(list(ids))
            self.raw_prompts.append(row[prompt_key])
            self.data_sources.append(str(row["data_source"]))
            self.reward_models.append(dict(row["reward_model"]))
            self.extra_infos.append(dict(extra) if isinstance(extra, dict) else {"value": extra})
            self.indices.append(extra.get("index", i) if isinstance(extra, dict) else i)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One prompt: token ids (no padding) and its per-row fields."""
        return {
            "input_ids": self.input_ids[i],
            "raw_prompt": self.raw_prompts[i],
            "data_source": self.data_sources[i],
            "reward_model": self.reward_models[i],
            "extra_info": self.extra_infos[i],
            "index": self.indices[i],
        }

    def __repr__(self) -> str:
        return f"PromptDataset(name={self.name!r}, prompts={len(self)})"


def _check_row(row: dict[str, Any], i: int, path: Path, prompt_key: str) -> None:
    for column in (prompt_key, "data_source", "reward_model"):
        if column not in row or row[column] is None:
            msg = f"{path} row {i}: missing required column {column!r}"
            raise DataError(msg)
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        msg = f"{path} row {i}: missing required column 'reward_model.ground_truth'"
        raise DataError(msg)


def _as_messages(prompt: Any, path: Path, i: int, prompt_key: str) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    # parquet hands back lists of dicts; numpy arrays appear when pandas wrote the file.
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in prompt
    ):
        return prompt
    msg = (
        f"{path} row {i}: column {prompt_key!r} must be a string or a list of "
        "{'role': ..., 'content': ...} messages"
    )
    raise DataError(msg)


def _mapped(
    row: dict[str, Any], columns: Any, prompt_key: str, path: Path, i: int
) -> dict[str, Any]:
    """``row`` with ``[data.columns]`` applied (a missing column is one line naming the key)."""
    out = dict(row)
    for key, target in (("prompt", prompt_key), ("ground_truth", None)):
        column = getattr(columns, key)
        if column is None:
            continue
        if column not in row:
            have = ", ".join(sorted(row)[:8])
            msg = f"{path} row {i}: no column {column!r} (data.columns.{key}); columns: {have}"
            raise DataError(msg)
        if target is not None:
            out[target] = row[column]
        else:
            out["reward_model"] = {
                **dict(row.get("reward_model") or {}),
                "ground_truth": row[column],
            }
    if columns.data_source is not None:
        out["data_source"] = columns.data_source
    return out
