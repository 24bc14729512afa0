"""Checkpoints that cannot run code, and are checked whole before a resume or an export uses them.

A DCP engine directory's metadata is read without running code
(:mod:`rlcore.checkpoint.dcp_metadata`, whose names are re-exported here). Here:

- :func:`verify_checkpoint` checks a ``global_step_<N>`` directory before anything loads it:
  the ``COMPLETE`` marker, ``trainer_state.json``, every file of ``MANIFEST.json`` (written by
  :func:`write_manifest` at save time) present with its size, every engine directory's DCP
  metadata loadable safely, its fields of the types DCP writes, and every shard it lists
  present, inside the directory and long enough, every bytes item a plain value; every
  ``*.pt`` file loadable with ``weights_only=True``; no symbolic link leading outside;
- :func:`pick_resume` is the ``latest`` resolution behind ``trainer.resume = "auto"``: the
  pointer's target if intact, else the newest intact checkpoint, with a warning for each one
  skipped; a pointer that is unreadable or names no checkpoint is ignored with a warning.

torch is imported only when a ``.metadata`` or ``*.pt`` file is read.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlcore.checkpoint.dcp_metadata import (
    MetadataUnpickler,
    UnsafeCheckpointError,
    load_dcp_metadata,
    safe_dcp_load,
    safe_load_planner,
    safe_storage_reader,
)
from rlcore.checkpoint.layout import (
    ACTOR_DIR,
    COMPLETE_MARKER,
    CRITIC_DIR,
    LATEST_FILE,
    STATE_FILE,
    CheckpointError,
    step_of,
)

log = logging.getLogger(__name__)

__all__ = [
    "MANIFEST_FILE",
    "MetadataUnpickler",
    "UnsafeCheckpointError",
    "load_dcp_metadata",
    "non_finite_weight",
    "pick_resume",
    "require_intact",
    "safe_dcp_load",
    "safe_load_planner",
    "safe_storage_reader",
    "verify_checkpoint",
    "weights_only_refusal",
    "write_manifest",
]

MANIFEST_FILE = "MANIFEST.json"
DCP_METADATA = ".metadata"
ENGINE_DIRS = (ACTOR_DIR, CRITIC_DIR)

# --- manifest ---------------------------------------------------------------------------------


def write_manifest(directory: str | os.PathLike[str]) -> Path:
    """Write ``MANIFEST.json`` in ``directory``: every file below it (relative path -> size)."""
    root = Path(directory)
    files: dict[str, int] = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            file = Path(dirpath) / name
            rel = file.relative_to(root).as_posix()
            if rel in (MANIFEST_FILE, COMPLETE_MARKER) or file.is_symlink():
                continue
            files[rel] = file.stat().st_size
    out = root / MANIFEST_FILE
    text = json.dumps({"files": dict(sorted(files.items()))}, indent=1)
    out.write_text(text + "\n", encoding="utf-8")
    return out


def _check_manifest(step_dir: Path) -> str | None:
    manifest = step_dir / MANIFEST_FILE
    if not manifest.is_file():
        return None  # written since this check exists; older checkpoints have none
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        listed = {str(k): int(v) for k, v in dict(files).items()}
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{manifest} is unreadable ({type(err).__name__})"
    for rel, size in listed.items():
        file = step_dir / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            return f"{manifest} lists {rel!r}, outside the checkpoint"
        if not file.is_file():
            return f"{file} is missing (listed in {MANIFEST_FILE})"
        actual = file.stat().st_size
        if actual != size:
            return f"{file} has {actual} bytes, {MANIFEST_FILE} says {size}"
    return None


# --- engine directories -------------------------------------------------------------------------


def _check_engine_dir(engine_dir: Path) -> str | None:
    """The DCP metadata of ``engine_dir`` loads safely and every shard it lists is there."""
    meta_file = engine_dir / DCP_METADATA
    if not meta_file.is_file():
        return None  # not a DCP directory (another engine's format): the manifest covers it
    try:
        metadata = load_dcp_metadata(meta_file)
    except UnsafeCheckpointError:
        raise  # crafted: refused, not skipped
    except CheckpointError as err:
        return str(err)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict) or not storage:
        return f"{meta_file} lists no shards"
    needed: dict[str, int] = {}
    bytes_items: list[Any] = []
    for index, info in storage.items():
        rel = str(getattr(info, "relative_path", ""))
        if not rel or Path(rel).name != rel or rel in (".", ".."):
            return f"{meta_file} names shard {rel!r}, outside {engine_dir}"
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        needed[rel] = max(needed.get(rel, 0), end)
        if _is_bytes_item(metadata, index) and not getattr(info, "transform_descriptors", None):
            bytes_items.append(info)
    for rel, end in sorted(needed.items()):
        shard = engine_dir / rel
        if not shard.is_file():
            return f"shard {shard} is missing (listed in {meta_file.name})"
        size = shard.stat().st_size
        if size < end:
            return f"shard {shard} is truncated ({size} bytes, its metadata needs {end})"
    for info in bytes_items:
        problem = _check_bytes_item(engine_dir / info.relative_path, info.offset, info.length)
        if problem:
            return problem
    return None


def _is_bytes_item(metadata: Any, index: Any) -> bool:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    item = metadata.state_dict_metadata.get(getattr(index, "fqn", None))
    return isinstance(item, BytesStorageMetadata)


def _check_bytes_item(shard: Path, offset: int, length: int) -> str | None:
    """A non-tensor item (an optimizer hyper-parameter) must load with ``weights_only``."""
    import torch

    with shard.open("rb") as fh:
        fh.seek(offset)
        data = fh.read(length)
    try:
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as err:  # UnpicklingError for a refused global; anything for garbage
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        msg = (
            f"refusing to load {shard}: an item at byte {offset} is not a plain value "
            f"({first[:200]}); the file may have been crafted to run code"
        )
        raise UnsafeCheckpointError(msg) from err
    return None


# --- whole checkpoints --------------------------------------------------------------------------


def verify_checkpoint(step_dir: str | os.PathLike[str]) -> str | None:
    """Why ``step_dir`` cannot be resumed from (one clause naming the file), or None if intact.

    A crafted file (metadata or bytes item that would run code) raises :class:`CheckpointError`
    instead: it is refused, never skipped quietly.
    """
    path = Path(step_dir)
    if step_of(path) is None or not path.is_dir():
        return f"{path} is not a global_step_N directory"
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        return f"{path} has no {COMPLETE_MARKER} marker (interrupted while being written)"
    steps: dict[Path, object] = {}
    for file in (marker, path / STATE_FILE):
        try:
            if file.exists():  # the trainer writes trainer_state.json; the manifest lists it
                payload = json.loads(file.read_text(encoding="utf-8"))
                steps[file] = payload.get("step") if isinstance(payload, dict) else None
        except (OSError, ValueError) as err:
            return f"{file} is unreadable ({type(err).__name__})"
    problem = _step_disagreement(path, steps)
    if problem:
        return problem
    _refuse_outside_links(path)
    problem = _check_manifest(path)
    if problem:
        return problem
    problem = _check_pt_files(path)
    if problem:
        return problem
    for name in ENGINE_DIRS:
        engine_dir = path / name
        if engine_dir.is_dir():
            problem = _check_engine_dir(engine_dir)
            if problem:
                return problem
    return None


def _step_disagreement(step_dir: Path, steps: dict[Path, object]) -> str | None:
    """The folder's step against the one the ``COMPLETE`` marker and ``trainer_state.json``
    record: a state file copied from another step would resume as that step (steps logged
    twice, the schedule and the data order off by the difference)."""
    want = step_of(step_dir)
    for file, step in steps.items():
        if step is not None and (isinstance(step, bool) or step != want):
            return f"{file} says step {step!r}, but the folder is {step_dir.name}"
    return None


def _refuse_outside_links(step_dir: Path) -> None:
    """A symbolic link under ``step_dir`` must stay inside it: one to elsewhere would make a
    resume or an export read any file of the machine as part of the checkpoint."""
    root = step_dir.resolve()
    for dirpath, dirnames, filenames in os.walk(step_dir):  # links are listed, not followed
        for name in dirnames + filenames:
            entry = Path(dirpath) / name
            if not entry.is_symlink():
                continue
            target = entry.resolve()
            if target != root and root not in target.parents:
                msg = (
                    f"refusing to load {entry}: it is a symbolic link to {target}, outside the "
                    f"checkpoint {step_dir}; copy the file into the checkpoint instead"
                )
                raise UnsafeCheckpointError(msg)


def weights_only_refusal(err: BaseException) -> str:
    """What torch's weights-only unpickler refused, in a few words (its own message is a
    page that suggests loading with ``weights_only=False``)."""
    text = str(err)
    marker = "Unsupported global: GLOBAL "
    at = text.find(marker)
    if at >= 0:
        rest = text[at + len(marker) :].split()
        if rest:
            return f"it refers to {rest[0][:100]}, which a plain tensor file never holds"
    return "weights-only loading refuses its contents"


def _check_pt_files(step_dir: Path) -> str | None:
    """Every ``*.pt`` of the checkpoint (driver RNG, worker state, engine extra state) loads
    with ``weights_only=True``. A refused global raises; a truncated file is damage."""
    for file in sorted(step_dir.rglob("*.pt")):
        import torch

        try:
            torch.load(file, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as err:
            msg = (
                f"refusing to load {file}: {weights_only_refusal(err)}; the file may have been "
                "crafted to run code"
            )
            raise UnsafeCheckpointError(msg) from None
        except (RuntimeError, EOFError, OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            return f"{file} is unreadable ({type(err).__name__}{': ' if first else ''}{first})"
    return None


def require_intact(step_dir: Path, where: str = "") -> Path:
    """``step_dir`` if :func:`verify_checkpoint` finds nothing wrong; else one-line error."""
    try:
        problem = verify_checkpoint(step_dir)
    except UnsafeCheckpointError as err:
        raise UnsafeCheckpointError(f"{where}{err}") from None
    if problem:
        msg = f"{where}checkpoint {step_dir} is damaged: {problem}; use an earlier one"
        raise CheckpointError(msg)
    return step_dir


def _read_pointer(root: Path) -> str | None:
    pointer = root / LATEST_FILE
    if not pointer.exists():
        return None
    try:
        name = pointer.read_bytes()[:256].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        name = None
    # Only a bare step-directory name: the pointer never leads outside the root.
    if not name or step_of(Path(name)) is None or Path(name).name != name:
        log.warning("ignoring %s: it does not name a global_step_N checkpoint", pointer)
        return None
    return name


def pick_resume(root: str | os.PathLike[str], complete: Iterable[Path]) -> Path | None:
    """The checkpoint to resume from under ``root`` (see module doc), or None if there is none.

    ``complete`` are the directories with a ``COMPLETE`` marker, oldest first. Raises
    :class:`CheckpointError` when checkpoints exist but none is intact.
    """
    base = Path(root)
    candidates = list(reversed(list(complete)))
    name = _read_pointer(base)
    if name is not None:
        target = base / name
        if target in candidates:
            candidates.remove(target)
        candidates.insert(0, target)
    skipped: list[str] = []
    for candidate in candidates:
        if not (candidate / COMPLETE_MARKER).is_file():  # missing, or an interrupted save
            log.warning(
                "%s names %r, which is not a complete checkpoint; trying the newest intact one",
                base / LATEST_FILE,
                candidate.name,
            )
            continue
        problem = verify_checkpoint(candidate)
        if problem is None:
            if skipped:
                log.warning("resuming from %s, the newest intact checkpoint", candidate)
            return candidate
        log.warning("skipping checkpoint %s: %s", candidate, problem)
        skipped.append(f"{candidate.name}: {problem}")
    if skipped:
        msg = (
            f"no intact checkpoint under {base} ({skipped[0]}); remove the damaged ones or "
            'set trainer.resume = "off" to start over'
        )
        raise CheckpointError(msg)
    return None


def non_finite_weight(engine_dir: str | os.PathLike[str]) -> str | None:
    """The name of the first model weight of a DCP engine directory holding NaN or inf, or
    None (also for a directory that is not DCP: another engine's format is not read).

    Reads the ``model.`` tensors (not the optimizer state) through the safe reader, on one
    process: a run that resumed such weights would train on NaN losses until the non-finite
    guard stops it, several steps and minutes later.
    """
    import torch

    meta_file = Path(engine_dir) / DCP_METADATA
    if not meta_file.is_file():
        return None
    saved = load_dcp_metadata(meta_file).state_dict_metadata
    model: dict[str, Any] = {}
    for fqn, item in saved.items():
        size = getattr(item, "size", None)
        dtype = getattr(getattr(item, "properties", None), "dtype", None)
        if fqn.startswith("model.") and size is not None and isinstance(dtype, torch.dtype):
            model[fqn.removeprefix("model.")] = torch.empty(tuple(size), dtype=dtype)
    if not model:
        return None
    with warnings.catch_warnings():  # one process on purpose: torch's warning says only that
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        safe_dcp_load({"model": model}, engine_dir, no_dist=True)
    for name, tensor in model.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def shape_mismatch(
    engine_dir: str | os.PathLike[str], model_dir: str | os.PathLike[str]
) -> str | None:
    """The first weight whose shape differs between a DCP engine directory and a model folder.

    DCP names the model's tensors ``model.<hf name>`` (the engine's ``{"model": state}``);
    names found on one side only are not compared. Reads headers and metadata only.
    """
    from rlcore.checkpoint.safetensors_header import read_safetensors_header

    meta_file = Path(engine_dir) / DCP_METADATA
    if not meta_file.is_file():
        return None
    saved = load_dcp_metadata(meta_file).state_dict_metadata
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        for name, info in read_safetensors_header(file, "model.path").items():
            item = saved.get(f"model.{name}")
            size = getattr(item, "size", None)
            if size is None or not isinstance(info, dict):
                continue
            if list(size) != list(info.get("shape") or []):
                return (
                    f"{name} has shape {list(info.get('shape') or [])} in {file} but "
                    f"{list(size)} in the checkpoint"
                )
    return None
