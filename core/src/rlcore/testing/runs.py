"""The tiny end-to-end run: arithmetic prompts, a tiny model and a TOML config around them.

The end-to-end tests and plugin authors' conformance checks all train the same thing: a
random ~0.1 M-parameter Qwen2 (:func:`tiny_run_model`) on "What is a + b?" prompts in verl's
row schema (:func:`arithmetic_rows`), scored by the GSM8K rule reward, with the HF rollout and
the default engine, for a couple of steps. :func:`tiny_run_toml` writes that config; its
keyword arguments are the knobs those runs turn (algorithm, steps, checkpointing, processes),
and ``extra`` appends whole sections a plugin needs::

    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(arithmetic_rows([(1, 2), (3, 4)] * 2), tmp_path / "train.jsonl")
    text = tiny_run_toml(model=model, train_files=[train], run_dir=tmp_path / "run")
    config = load_config_text(text, source="tiny.toml")

A run of 2 steps takes a few seconds per step on one CPU. Nothing heavy is imported here:
torch and transformers load only when :func:`tiny_run_model` builds the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "TRAIN_SCRIPT",
    "arithmetic_rows",
    "tiny_run_model",
    "tiny_run_toml",
    "write_jsonl",
    "write_train_script",
]

# A driver for a run in a subprocess with its own local Ray (so env vars
# reach the workers, and killing its process group kills the whole run): it loads the TOML
# file named by argv[1], trains, and on an RlcoreError prints one ``error: ...`` line to
# stderr and exits 2.
TRAIN_SCRIPT = """
import logging, sys
from pathlib import Path
from rlcore.config import load_config_text
from rlcore.errors import RlcoreError
from rlcore.workers.cluster import start_ray
from rlcore.trainer import run_training

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
path = Path(sys.argv[1])
config = load_config_text(path.read_text(), source=str(path))
start_ray(config.resources)
try:
    sys.exit(run_training(config))
except RlcoreError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
"""


def arithmetic_rows(
    pairs: Iterable[tuple[int, int]],
    split: str = "train",
    data_source: str = "arithmetic",
) -> list[dict[str, Any]]:
    """One verl-schema row per ``(a, b)``: the chat prompt "What is a + b?", answer ``a + b``.

    ``extra_info`` carries ``split`` and the row's ``index``; ``data_source`` names the
    validation metrics (``val/<data_source>/acc``).
    """
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, b) in enumerate(pairs)
    ]


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` as JSON lines to ``path`` (its folder must exist); returns ``Path(path)``."""
    out = Path(path)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def write_train_script(path: str | os.PathLike[str]) -> Path:
    """Write :data:`TRAIN_SCRIPT` to ``path``; run it as ``python <path> <config.toml>``."""
    out = Path(path)
    out.write_text(TRAIN_SCRIPT)
    return out


def tiny_run_model(path: str | os.PathLike[str]) -> Path:
    """Build the tiny run's model under ``path``: hidden 64, 1 layer, 2 heads (1 KV head)."""
    from rlcore.testing.tiny_model import build_tiny_model

    return build_tiny_model(path, hidden=64, layers=1, heads=2, kv_heads=1)


def _path(value: str | os.PathLike[str]) -> str:
    # A JSON string of ASCII is a valid TOML basic string (quotes and backslashes escaped).
    return json.dumps(os.fspath(value))


def _paths(values: Sequence[str | os.PathLike[str]]) -> str:
    return "[" + ", ".join(_path(v) for v in values) + "]"


def tiny_run_toml(
    *,
    model: str | os.PathLike[str],
    train_files: Sequence[str | os.PathLike[str]],
    run_dir: str | os.PathLike[str],
    val_files: Sequence[str | os.PathLike[str]] = (),
    algorithm: str = "grpo",
    algorithm_options: str = "",
    total_steps: int = 2,
    train_batch_size: int = 4,
    n: int = 2,
    micro_batch_size: int = 8,
    lr: float = 1e-3,
    critic_lr: float | None = None,
    save_freq: int = 0,
    test_freq: int = 0,
    keep_last: int | None = None,
    seed: int = 0,
    processes_per_node: int = 1,
    cpus_per_process: float | None = None,
    experiment_name: str = "rlcore",
    rewards: Sequence[str] = ("gsm8k",),
    extra: str = "",
) -> str:
    """The TOML text of the tiny run (load it with ``rlcore.config.load_config_text``).

    Prompts up to 64 tokens, responses up to 8, ``n`` samples each from the HF rollout, the
    GSM8K reward (or the ``rewards`` named), JSONL metrics in ``run_dir``.
    ``algorithm_options`` are lines added to ``[algorithm]`` (e.g. ``"use_kl_in_reward =
    true"``); ``critic_lr`` adds a ``[critic]`` section (PPO needs one); ``keep_last`` and
    ``cpus_per_process`` are left to the schema's defaults when None; ``extra`` is TOML
    appended at the end (whole sections).
    """
    critic = "" if critic_lr is None else f"\n[critic]\noptim = {{ lr = {critic_lr!r} }}\n"
    keep = "" if keep_last is None else f"keep_last = {keep_last}\n"
    cpus = "" if cpus_per_process is None else f"cpus_per_process = {cpus_per_process!r}\n"
    val = f"val_files = {_paths(val_files)}\n" if val_files else ""
    return f"""
[data]
train_files = {_paths(train_files)}
{val}max_prompt_length = 64
max_response_length = 8
train_batch_size = {train_batch_size}

[model]
path = {_path(model)}

[actor]
micro_batch_size = {micro_batch_size}
optim = {{ lr = {lr!r} }}
{critic}
[rollout]
name = "hf"
n = {n}

[reward]
default = {json.dumps(list(rewards))}

[algorithm]
name = {json.dumps(algorithm)}
{algorithm_options}

[trainer]
total_steps = {total_steps}
save_freq = {save_freq}
test_freq = {test_freq}
{keep}seed = {seed}
experiment_name = {json.dumps(experiment_name)}
run_dir = {_path(run_dir)}
loggers = ["jsonl"]

[resources]
processes_per_node = {processes_per_node}
{cpus}
{extra}
"""
