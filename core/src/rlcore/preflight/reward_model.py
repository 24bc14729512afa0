"""``[reward_model]`` before Ray starts: its folder exists and holds a sequence classifier.

An enabled reward model whose ``model.path`` does not exist (or holds no weights), or whose
``config.json`` is not a ``...ForSequenceClassification`` with one label, is one line naming
the key (:func:`check_reward_model`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlcore.errors import ConfigError
from rlcore.preflight.model import check_model_folder

if TYPE_CHECKING:
    from rlcore.config import RunConfig

__all__ = ["REWARD_MODEL_PATH_KEY", "check_reward_model"]

REWARD_MODEL_PATH_KEY = "reward_model.model.path"
_KEY = REWARD_MODEL_PATH_KEY


def check_reward_model(config: RunConfig) -> None:
    """An enabled ``[reward_model]``'s folder exists, holds weights, and its ``config.json``
    is a sequence-classification model with one label; one line naming the key otherwise."""
    rm = config.reward_model
    if not rm.enable:
        return
    check_model_folder(rm.model.path, _KEY)
    hf = json.loads((Path(rm.model.path) / "config.json").read_text(encoding="utf-8"))
    archs = [a for a in hf.get("architectures") or [] if isinstance(a, str)]
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        found = ", ".join(archs) or "none"
        msg = (
            f"{_KEY}: {rm.model.path} is not a sequence-classification model (architectures: "
            f"{found}); save the reward model with AutoModelForSequenceClassification "
            "(num_labels = 1)"
        )
        raise ConfigError(msg)
    labels = hf.get("num_labels", len(hf.get("id2label") or {}) or 2)
    if labels != 1:
        msg = (
            f"{_KEY}: {rm.model.path} has {labels} labels; a reward model scores with one "
            "(num_labels = 1)"
        )
        raise ConfigError(msg)
