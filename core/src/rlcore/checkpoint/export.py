"""``rlcore export CHECKPOINT [--format hf] OUT``: a trained actor as a Hugging Face folder.

``CHECKPOINT`` is a ``global_step_<N>`` directory, a checkpoint root or a run directory (its
latest complete checkpoint; see :mod:`rlcore.checkpoint`). The step directory holds the
actor engine's state in ``actor/`` and the resolved run config in ``config.toml``. The export
reads only ``[model]`` and ``[actor.engine]`` from that config, so the rollout and reward
plugins of the run need not be installed where the export runs.

The actor's engine plugin is built in this process on a private one-rank gloo group (no Ray,
CPU), restores ``actor/`` with ``load_checkpoint`` (sharded checkpoints of any world size
are resharded by the engine) and writes the folder with ``export_hf``. The folder is written
beside ``OUT`` under a temporary name and renamed into place when complete.

Nothing in a checkpoint decides whether code runs: ``trust_remote_code`` comes only from
``--trust-remote-code`` (the checkpoint's ``model.trust_remote_code`` is not used), and
without it a model or tokenizer folder whose JSON files carry an ``auto_map`` (code of its own,
which transformers would import) is refused with one line before anything is loaded. The
exported folder carries no ``.py`` file and no ``auto_map`` unless the flag was given.

A LoRA actor exports, with ``--lora merged`` (the default), a plain transformers folder of
the merged weights (``W + scaling * B @ A``), or with ``--lora adapter`` a peft adapter folder
(``adapter_config.json``, ``adapter_model.safetensors``) that
``PeftModel.from_pretrained(base_model, OUT)`` loads on top of ``[model] path``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rlcore.checkpoint.manager import ACTOR_DIR, CONFIG_FILE, find_checkpoint
from rlcore.errors import RlcoreError
from rlcore.interfaces import DTYPE_NAMES

log = logging.getLogger(__name__)

__all__ = [
    "FORMATS",
    "LORA_FORMS",
    "ExportError",
    "export_checkpoint",
    "main",
    "remote_code_reference",
    "strip_remote_code",
]

FORMATS = ("hf",)
LORA_FORMS = ("merged", "adapter")


class ExportError(RlcoreError):
    """The checkpoint cannot be exported as asked; the message names what to fix."""


class _Parser(argparse.ArgumentParser):
    # One line and exit code 2 through the CLI's error path, like every other user error.
    def error(self, message: str) -> NoReturn:
        msg = f"export: {message} (usage: rlcore export CHECKPOINT --format hf OUT)"
        raise ExportError(msg)


def _config_file(step_dir: Path) -> Path:
    """``config.toml`` of the step directory, else of the run directory above it."""
    for candidate in (step_dir / CONFIG_FILE, step_dir.parent.parent / CONFIG_FILE):
        if candidate.is_file():
            return candidate
    msg = (
        f"checkpoint {step_dir} has no {CONFIG_FILE} (the resolved run config the trainer "
        "writes next to actor/); copy the run's config.toml into it"
    )
    raise ExportError(msg)


def _engine_from_config(
    config_file: Path,
    registry: Any,
    model_path: str | None,
    dtype: str | None,
    trust_remote_code: bool,
) -> tuple[type, Any, dict[str, Any]]:
    """The actor engine class, its ``Config`` and the model fields, from ``config_file``."""
    from rlcore.config import ConfigValidationError, ModelConfig, read_toml
    from rlcore.config.convert import Problem, render_path, structure

    raw = read_toml(config_file)
    problems: list[Problem] = []
    model_raw = dict(raw.get("model") or {})
    if model_path is not None:
        model_raw["path"] = model_path
        model_raw.pop("tokenizer_path", None)  # unset: resolved to the new path below
    model, found = structure(model_raw, ModelConfig, ("model",))
    problems.extend(found)
    actor = raw.get("actor") or {}
    engine_raw = dict(actor.get("engine") or {}) if isinstance(actor, dict) else {}
    name = engine_raw.pop("name", "fsdp2")
    cls = registry.resolve("engine", str(name), where=f"[actor.engine] of {config_file}")
    options, found = structure(engine_raw, cls.Config, ("actor", "engine"), ("name",))
    problems.extend(found)
    if problems:
        lines = [f"{render_path(p)}: {m}" if p else m for p, m in problems]
        raise ConfigValidationError(str(config_file), lines)
    path = Path(model.path)
    if not (path / "config.json").is_file():
        msg = (
            f"model.path {path} (from {config_file}) has no config.json: the export needs "
            "the run's base model folder; pass --model-path"
        )
        raise ExportError(msg)
    tokenizer_path = Path(model.tokenizer_path or path)
    if not trust_remote_code:
        for folder in dict.fromkeys((path, tokenizer_path)):
            code = remote_code_reference(folder)
            if code is not None:
                ignored = (
                    f" (model.trust_remote_code = true in {config_file} is not used)"
                    if model.trust_remote_code
                    else ""
                )
                msg = (
                    f"{folder} needs code of its own ({code}); rlcore export runs no code "
                    f"named by a checkpoint{ignored}: pass --trust-remote-code if you trust "
                    f"{folder}"
                )
                raise ExportError(msg)
    fields = {
        "model_path": str(path),
        "tokenizer_path": str(tokenizer_path),
        "dtype": dtype or model.dtype,
        "trust_remote_code": trust_remote_code,  # the caller's word, never the checkpoint's
    }
    return cls, options, fields


# Files of a model or tokenizer folder that transformers reads and that can name Python code
# to import (an "auto_map" entry, with trust_remote_code). Chat templates are rendered in
# jinja's sandbox and generation configs name no code: neither can run anything.
def remote_code_reference(folder: Path) -> str | None:
    """``"<file> maps <class> to <code>"`` for the first ``auto_map`` in the top-level JSON
    files of ``folder``, or None when transformers would import no code from it."""
    for file in sorted(folder.glob("*.json")):
        data = _json_file(file)
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if auto_map:
            first = next(iter(auto_map.items())) if isinstance(auto_map, dict) else auto_map
            return f"{file.name} has an auto_map: {str(first)[:120]}"
    return None


def _json_file(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # not ours to judge: transformers reports a broken config itself


def strip_remote_code(folder: Path) -> list[str]:
    """Remove every ``.py`` file under ``folder`` and ``auto_map`` from its JSON files, so the
    exported folder names no code; return what was removed (relative names)."""
    removed: list[str] = []
    for file in sorted(folder.rglob("*.py")):
        file.unlink()
        removed.append(file.relative_to(folder).as_posix())
    for file in sorted(folder.glob("*.json")):
        data = _json_file(file)
        if isinstance(data, dict) and "auto_map" in data:
            del data["auto_map"]
            file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            removed.append(f"{file.name}:auto_map")
    return removed


def _private_group() -> bool:
    """Create a one-rank gloo group unless one exists; True when this call created it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    from torch._C._distributed_c10d import HashStore  # torch.distributed re-exports it untyped

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    return True


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    fmt: str = "hf",
    model_path: str | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
    lora: str = "merged",
    registry: Any = None,
    trust_remote_code: bool = False,
) -> Path:
    """Export the actor of ``checkpoint`` to ``out``; return ``out``.

    ``trust_remote_code``: allow the model's own code (an ``auto_map`` in its folder) to run
    here and carry it into ``out``; without it such a model is an :class:`ExportError`.

    ``model_path`` replaces ``[model] path`` of the checkpoint's config (the base model moved).
    ``dtype`` is the dtype of the written weights (default: the run's ``model.dtype``).
    ``lora``: for a LoRA actor, ``"merged"`` (a transformers folder) or ``"adapter"`` (a peft
    adapter folder); ``"adapter"`` for an actor without adapters is an error.
    """
    from rlcore.interfaces import EngineSpec
    from rlcore.plugins import default_registry

    if fmt not in FORMATS:
        msg = f"unknown export format {fmt!r}; available: {', '.join(FORMATS)}"
        raise ExportError(msg)
    if lora not in LORA_FORMS:
        msg = f"unknown --lora {lora!r}; choose from {', '.join(LORA_FORMS)}"
        raise ExportError(msg)
    if dtype is not None and dtype not in DTYPE_NAMES:
        msg = f"unknown dtype {dtype!r}; choose from {', '.join(DTYPE_NAMES)}"
        raise ExportError(msg)
    step_dir = find_checkpoint(checkpoint)
    actor_dir = step_dir / ACTOR_DIR
    if not actor_dir.is_dir():
        msg = f"checkpoint {step_dir} has no {ACTOR_DIR}/ directory (the actor engine's state)"
        raise ExportError(msg)
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not overwrite:
        msg = f"output {target} exists and is not empty; choose a new folder or pass --overwrite"
        raise ExportError(msg)
    config_file = _config_file(step_dir)
    cls, options, fields = _engine_from_config(
        config_file, registry or default_registry(), model_path, dtype, trust_remote_code
    )

    spec = EngineSpec(
        role="actor",
        model_path=fields["model_path"],
        dtype=fields["dtype"],
        trust_remote_code=fields["trust_remote_code"],
        device="cpu",
        optim=None,  # no optimizer state: only the weights are restored
        micro_batch_size=1,
    )
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _check_before_loading(actor_dir, fields["model_path"], target, tmp)  # shapes, writable
    created = _private_group()
    try:
        log.info("loading %s (%s engine) from %s", spec.role, cls.__name__, actor_dir)
        engine = cls(spec, options)
        engine.load_checkpoint(str(actor_dir))
        try:
            if lora == "adapter":
                engine.export_adapter(str(tmp))
            else:
                engine.export_hf(str(tmp))
        except NotImplementedError as err:
            what = "a LoRA adapter folder" if lora == "adapter" else "a Hugging Face folder"
            reason = str(err) or f"{cls.__name__} does not implement this export"
            msg = (
                f"the actor's engine ({cls.__module__}:{cls.__qualname__}) cannot export "
                f"{what}: {reason}"
            )
            raise ExportError(msg) from err
        _ensure_tokenizer(tmp, fields["tokenizer_path"], fields["trust_remote_code"])
        del engine
        if not trust_remote_code:
            removed = strip_remote_code(tmp)
            if removed:
                log.warning("not exported (code; --trust-remote-code keeps it): %s", removed)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()
    if target.exists():
        trash = target.parent / f".{target.name}.old-{time.time_ns()}"
        os.replace(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, target)
    log.info("exported %s to %s", step_dir, target)
    return target


def _check_before_loading(actor_dir: Path, model_path: str, target: Path, tmp: Path) -> None:
    """The model folder fits the checkpoint and OUT's folder is writable: one line if not."""
    from rlcore.checkpoint.safe_load import shape_mismatch

    mismatch = shape_mismatch(actor_dir, model_path)
    if mismatch:
        msg = f"model {model_path} does not fit checkpoint {actor_dir}: {mismatch}; pass the "
        msg += "run's base model with --model-path"
        raise ExportError(msg)
    try:
        tmp.mkdir(parents=True)
    except OSError as err:
        msg = f"cannot write {target} ({err.strerror or err}); choose a writable OUT"
        raise ExportError(msg) from err
    tmp.rmdir()


def _ensure_tokenizer(folder: Path, tokenizer_path: str, trust_remote_code: bool) -> None:
    """Save the run's tokenizer into ``folder`` unless the engine's export wrote one."""
    if (folder / "tokenizer_config.json").is_file():
        return
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_path, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        msg = f"no tokenizer could be loaded from {tokenizer_path} to export with the model"
        raise ExportError(msg) from err
    tokenizer.save_pretrained(folder)


def main(argv: Sequence[str]) -> int:
    """``rlcore export``: returns 0; user errors raise :class:`RlcoreError` (exit code 2)."""
    parser = _Parser(
        prog="rlcore export",
        description="Export the actor of a checkpoint (e.g. to a Hugging Face folder).",
    )
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="global_step_N dir, or a run dir (its latest)"
    )
    parser.add_argument("out", metavar="OUT", help="output folder")
    parser.add_argument("--format", default="hf", help="output format (hf)")
    parser.add_argument("--model-path", help="base model folder, if it moved since training")
    parser.add_argument("--dtype", help="dtype of the written weights (default: model.dtype)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the model's own code (auto_map) run and keep it in OUT; never read from "
        "the checkpoint",
    )
    parser.add_argument(
        "--lora",
        default="merged",
        choices=LORA_FORMS,
        help="a LoRA actor: merged weights (transformers) or the adapter folder (peft)",
    )
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv))
    out = export_checkpoint(
        args.checkpoint,
        args.out,
        fmt=args.format,
        model_path=args.model_path,
        dtype=args.dtype,
        overwrite=args.overwrite,
        lora=args.lora,
        trust_remote_code=args.trust_remote_code,
    )
    print(f"exported {args.checkpoint} to {out}")
    return 0
