"""The tiny runs the fault-tolerance tests share (test_recovery, test_elastic): 16 arithmetic
prompts, unshuffled, every step's samples written to ``<run>/samples`` for the audit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def fault_assets(root: Path) -> tuple[Path, Path]:
    """The tiny run's model and its 16 training prompts under ``root``."""
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    model = tiny_run_model(root / "model")
    rows = arithmetic_rows([(a, b) for a in range(4) for b in range(4)])
    return model, write_jsonl(rows, root / "train.jsonl")


def fault_config(assets: tuple[Path, Path], run: Path, *, trainer: str = "", **toml: Any) -> Any:
    """The tiny run's config in ``run`` (seed 3, unshuffled), ``trainer`` lines added to
    ``[trainer]`` beside ``rollout_data_dir = <run>/samples``; ``toml`` goes to
    :func:`~rlcore.testing.runs.tiny_run_toml`."""
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml

    model, train = assets
    text = tiny_run_toml(model=model, train_files=[train], run_dir=run, seed=3, **toml)
    text = text.replace("[data]\n", "[data]\nshuffle = false\n", 1)
    dump = json.dumps(str(run / "samples"))
    text = text.replace("[trainer]\n", f"[trainer]\nrollout_data_dir = {dump}\n{trainer}\n", 1)
    return load_config_text(text, source=f"{run.name}.toml")
