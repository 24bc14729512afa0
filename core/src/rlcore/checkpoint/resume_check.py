"""Resume only what the checkpoint was trained as: the same model, the same optimizer settings.

A checkpoint holds the weights *and* the optimizer state of one model; its ``config.toml`` is
the run's resolved config. On resume the engine restores the optimizer's saved hyper-parameters
too, so a changed ``actor.optim.lr`` would be silently ignored, and another model would fail
deep inside a worker. Decision (documented in the README's resume section and tested in
``tests/test_bad_inputs_checkpoints.py``): **refuse**, with one line naming every key that
differs and its two values, before Ray starts. To continue with other settings, start a new
run directory from the exported weights (``rlcore export CKPT OUT`` then ``model.path = OUT``).

Compared: ``model.path`` (equal when both folders hold the same ``config.json`` and weight
files of the same names and sizes, so a moved model still resumes), ``model.dtype``, every
key of ``actor.optim`` and ``critic.optim``, and of ``actor.engine`` and ``critic.engine``
the engine's name and its adapter (``lora_rank``, ``lora_alpha``, ``target_modules``,
``exclude_modules``).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.checkpoint.layout import ACTOR_DIR, CRITIC_DIR
from rlcore.checkpoint.manager import CONFIG_FILE, CheckpointError

if TYPE_CHECKING:
    from rlcore.config import RunConfig

__all__ = ["check_finite_weights", "check_resume_compatible", "config_differences"]

_OPTIM_TABLES = (("actor", "optim"), ("critic", "optim"))
# What an engine's saved state is shaped by: the engine, and the adapter (verl's LoRA names).
# A changed rank or target set fails inside a worker's load with a remote traceback.
_ENGINE_TABLES = (("actor", "engine"), ("critic", "engine"))
_ENGINE_KEYS = ("name", "lora_rank", "lora_alpha", "target_modules", "exclude_modules")


def _table(raw: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node: Any = raw
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return dict(node) if isinstance(node, dict) else {}


def _model_json(path: Any) -> Any:
    try:
        return json.loads((Path(str(path)) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _same_model(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return old is None and new is None
    if os.path.abspath(str(old)) == os.path.abspath(str(new)):
        return True
    # A moved or copied model: the same config.json and weight files of the same sizes.
    before = _model_json(old)
    return bool(
        before is not None and before == _model_json(new) and _weights(old) == _weights(new)
    )


def _weights(path: Any) -> dict[str, int]:
    folder = Path(str(path))
    files = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    return {f.name: f.stat().st_size for f in files}


def config_differences(
    saved: dict[str, Any], current: dict[str, Any], *, critic: bool = True
) -> list[str]:
    """``key (checkpoint X, now Y)`` for each compared key that differs; ``critic``: whether
    the checkpoint holds a critic (its engine table is the actor's copy otherwise)."""
    found: list[str] = []
    old_model, new_model = _table(saved, ("model",)), _table(current, ("model",))
    if not _same_model(old_model.get("path"), new_model.get("path")):
        found.append(
            f"model.path (checkpoint {old_model.get('path')}, now {new_model.get('path')})"
        )
    if old_model.get("dtype") != new_model.get("dtype"):
        found.append(
            f"model.dtype (checkpoint {old_model.get('dtype')}, now {new_model.get('dtype')})"
        )
    for path in _OPTIM_TABLES:
        old, new = _table(saved, path), _table(current, path)
        if not old:  # the checkpoint's run had no such table (e.g. no critic)
            continue
        for key in sorted(set(old) | set(new)):
            a, b = old.get(key), new.get(key)
            if isinstance(a, list | tuple) and isinstance(b, list | tuple):
                a, b = list(a), list(b)
            if a != b:
                found.append(f"{'.'.join(path)}.{key} (checkpoint {a}, now {b})")
    for path in _ENGINE_TABLES:
        old, new = _table(saved, path), _table(current, path)
        if not old or (path[0] == "critic" and not critic):
            continue
        for key in _ENGINE_KEYS:
            if key not in old and key not in new:
                continue
            a, b = old.get(key), new.get(key)
            if isinstance(a, list | tuple) and isinstance(b, list | tuple):
                a, b = list(a), list(b)
            if a != b:
                found.append(f"{'.'.join(path)}.{key} (checkpoint {a}, now {b})")
    return found


def check_resume_compatible(config: RunConfig, step_dir: Path) -> None:
    """Raise :class:`CheckpointError` (one line) if ``config`` changed what ``step_dir`` holds."""
    from rlcore.config import config_to_dict

    file = step_dir / CONFIG_FILE
    if not file.is_file():
        return  # written since the first checkpoints; nothing to compare with
    try:
        saved = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        msg = f"checkpoint {step_dir}: cannot read {file.name} ({type(err).__name__})"
        raise CheckpointError(msg) from err
    critic = (step_dir / CRITIC_DIR).is_dir()
    differences = config_differences(saved, config_to_dict(config), critic=critic)
    if differences:
        msg = (
            f"trainer.resume: checkpoint {step_dir} was trained with other settings: "
            f"{'; '.join(differences)}; restore them, or start a new trainer.run_dir from its "
            "weights (rlcore export, then model.path)"
        )
        raise CheckpointError(msg)


def check_finite_weights(step_dir: Path) -> None:
    """Raise :class:`CheckpointError` (one line naming the tensor) if a trained model of
    ``step_dir`` holds NaN or inf (``trainer.check_finite_on_resume = false`` skips it)."""
    from rlcore.checkpoint.safe_load import non_finite_weight

    for role in (ACTOR_DIR, CRITIC_DIR):
        name = non_finite_weight(step_dir / role)
        if name is not None:
            msg = (
                f"trainer.resume: checkpoint {step_dir}: {role} weight {name} holds NaN or inf; "
                "resume from an earlier checkpoint, or set trainer.check_finite_on_resume = "
                "false to load it anyway"
            )
            raise CheckpointError(msg)
