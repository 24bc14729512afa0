"""Checkpoint directories: atomic writes, a ``latest`` pointer, pruning, resume resolution.

Layout under a checkpoint root (the trainer uses ``<run_dir>/checkpoints``)::

    checkpoints/
      latest                    text: "global_step_40\\n" (written last, atomically)
      global_step_20/
      global_step_40/
        COMPLETE                JSON {"step": 40, "time": ...}; written by the manager last
        config.toml             the resolved run config (``rlcore export`` reads it)
        trainer_state.json      step, dataloader position, algorithm state (JSON only)
        rng_state.pt            driver RNG: python, numpy, torch (+cuda); tensors only
        actor/                  the actor engine's ``save_checkpoint`` (sharded, every rank)
          worker_state_rank<r>.pt   the policy worker's map: RNG, LR-schedule position,
                                    rollout sampling state (one file per rank, RNG saved once)
        critic/                 the critic engine's, when the algorithm trains one
          worker_state_rank<r>.pt   the critic worker's map: LR-schedule position
        rollout/                the rollout pool's ranks' counters (rollout on a pool of its own)
        async_queue/            trainer.async_mode: the queued generations (queue.json,
                                batch_<i>.pt; rlcore.trainer.queue_checkpoint)

What each role's checkpoint holds is one map, built and restored in one place (the worker's
``_checkpoint_states``), written with :func:`save_worker_state`.

A save writes everything into a hidden temporary directory (``.tmp-global_step_40``),
fsyncs every file and directory, renames it into place and only then replaces ``latest``.
A process killed at any point leaves either the old ``latest`` or the new one pointing at a
complete directory; leftover temporary directories are never taken for checkpoints and are
removed by the next save. Pruned directories are first renamed away, so a crash mid-delete
cannot leave a half-deleted directory that looks complete.

Workers (Ray actors) write their engine shards straight into the given path: they run on the
same machine as the driver. Across several nodes the root must be on a shared filesystem.

torch is imported only by the RNG helpers; RNG tensors are loaded with
``torch.load(weights_only=True)`` so a checkpoint can never run code when resumed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from rlcore.checkpoint.layout import (
    _STEP_PREFIX,
    _TMP_PREFIX,
    _TRASH_PREFIX,
    ACTOR_DIR,
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    CONFIG_FILE,
    CRITIC_DIR,
    LATEST_FILE,
    RNG_FILE,
    STATE_FILE,
    CheckpointError,
    step_of,
)
from rlcore.checkpoint.space import disk_full

log = logging.getLogger(__name__)

__all__ = [
    "ACTOR_DIR",
    "CHECKPOINTS_DIR",
    "COMPLETE_MARKER",
    "CONFIG_FILE",
    "CRITIC_DIR",
    "LATEST_FILE",
    "RNG_FILE",
    "STATE_FILE",
    "CheckpointError",
    "CheckpointManager",
    "DriverState",
    "capture_rng_state",
    "find_checkpoint",
    "load_driver_state",
    "load_worker_state",
    "restore_rng_state",
    "save_driver_state",
    "save_worker_state",
    "step_of",
]


def _is_complete(path: Path) -> bool:
    return step_of(path) is not None and (path / COMPLETE_MARKER).is_file()


# --- durability -------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    # A rename or a new entry is durable only once its directory is synced (POSIX).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories; nothing more to do there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file, then every directory bottom-up, under ``root``."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            file = Path(dirpath) / name
            if file.is_symlink():
                continue
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: write a sibling, fsync, rename, fsync the directory."""
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


# --- the manager --------------------------------------------------------------------------


class CheckpointManager:
    """Atomic ``global_step_<N>`` directories under ``root``; keeps the last ``keep_last``.

    ``keep_last=None`` keeps every checkpoint. Only one process (the driver) saves to a root.
    """

    def __init__(self, root: str | os.PathLike[str], keep_last: int | None = None) -> None:
        if keep_last is not None and keep_last < 1:
            msg = f"trainer.keep_last must be >= 1 or unset, got {keep_last}"
            raise CheckpointError(msg)
        self.root = Path(root)
        self.keep_last = keep_last

    def step_dir(self, step: int) -> Path:
        return self.root / f"{_STEP_PREFIX}{step}"

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories, oldest step first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and _is_complete(p)]
        return sorted(found, key=lambda p: step_of(p) or 0)

    # --- save ---------------------------------------------------------------------------

    def save(self, step: int, write_fn: Callable[[Path], None]) -> Path:
        """Write checkpoint ``step`` through ``write_fn(tmp_dir)``; return its final directory.

        ``write_fn`` fills the (existing, empty) temporary directory: engine shards in
        ``actor/``/``critic/``, :func:`save_driver_state`, ``config.toml``. If it raises, the
        temporary directory is removed and ``latest`` still names the previous checkpoint.
        """
        if step < 0:
            msg = f"checkpoint step must be >= 0, got {step}"
            raise CheckpointError(msg)
        final = self.step_dir(step)
        tmp = self.root / f"{_TMP_PREFIX}{final.name}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers()
            tmp.mkdir()
        except OSError as err:  # a folder made read-only (or full) after the run started
            raise self._save_error(step, err) from err
        try:
            write_fn(tmp)
            from rlcore.checkpoint.safe_load import write_manifest  # resume checks every file

            write_manifest(tmp)
            marker = {"step": step, "time": time.time()}
            (tmp / COMPLETE_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
            _fsync_tree(tmp)
            if final.exists():
                # Saving a step again (a resume from an older checkpoint got this far): move the
                # old one away first, since a rename cannot replace a non-empty directory.
                self._discard(final)
            os.replace(tmp, final)
        except BaseException as err:
            # Earlier checkpoints and ``latest`` are untouched: only this attempt goes. A full
            # disk is told apart before the partial save is removed (which frees the space).
            full = isinstance(err, Exception) and disk_full(err, tmp if tmp.exists() else self.root)
            shutil.rmtree(tmp, ignore_errors=True)
            if full:
                raise self._disk_full_error(step) from err
            if isinstance(err, OSError):
                raise self._save_error(step, err) from err
            raise
        try:
            _fsync_dir(self.root)
            _write_atomic(self.root / LATEST_FILE, final.name + "\n")
        except OSError as err:  # the step is complete on disk; resume finds it without latest
            raise self._save_error(step, err) from err
        log.info("checkpoint saved: %s", final)
        self._prune(keep=final)
        return final

    def _disk_full_error(self, step: int) -> CheckpointError:
        return self.disk_full_error(self.root, f"saving step {step}")

    def disk_full_error(self, folder: Path, doing: str) -> CheckpointError:
        """The one line of a write into ``folder`` that found the disk full while ``doing``
        (a save, the final export): what is still safe on disk."""
        previous = self.checkpoints()
        kept = (
            f"the previous checkpoint at step {step_of(previous[-1])} is intact"
            if previous
            else "no checkpoint was saved before"
        )
        return CheckpointError(f"no space left on {folder} while {doing}; {kept}")

    def _save_error(self, step: int, err: OSError) -> CheckpointError:
        if disk_full(err, self.root):
            return self._disk_full_error(step)
        where = err.filename or self.root
        previous = self.checkpoints()
        kept = (
            f"the last saved checkpoint, {previous[-1].name}, is intact"
            if previous
            else "no checkpoint was saved before"
        )
        msg = (
            f"cannot save checkpoint step {step} in {self.root}: {where}: "
            f"{err.strerror or err}; make the folder writable (or free space) and rerun to "
            f"resume; {kept}"
        )
        return CheckpointError(msg)

    def _remove_leftovers(self) -> None:
        """Temporary and trash directories of an earlier process that was killed."""
        for p in self.root.iterdir():
            if p.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)) and p.is_dir():
                log.warning("removing %s left by an interrupted save or prune", p)
                shutil.rmtree(p, ignore_errors=True)
            elif p.name == f"{LATEST_FILE}.tmp":
                p.unlink(missing_ok=True)

    def _discard(self, path: Path) -> None:
        trash = self.root / f"{_TRASH_PREFIX}{path.name}-{os.getpid()}-{time.time_ns()}"
        os.replace(path, trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)

    def _prune(self, keep: Path) -> None:
        if self.keep_last is None:
            return
        complete = self.checkpoints()
        kept = set(complete[-self.keep_last :]) | {keep}
        for path in complete:
            if path not in kept:
                log.info("removing old checkpoint %s (keep_last=%d)", path, self.keep_last)
                self._discard(path)

    # --- find ---------------------------------------------------------------------------

    def latest(self) -> Path | None:
        """The intact checkpoint ``latest`` names, else the newest intact one (warnings say
        which were skipped and why; see :func:`rlcore.checkpoint.safe_load.pick_resume`)."""
        from rlcore.checkpoint.safe_load import pick_resume

        return pick_resume(self.root, self.checkpoints())

    def resolve_resume(self, resume: str) -> Path | None:
        """``trainer.resume``: ``"off"`` -> None, ``"auto"`` -> :meth:`latest`, else a path.

        A path may be a step directory, a checkpoint root or a run directory (its
        ``checkpoints/``); one without a complete checkpoint is an error.
        """
        if resume == "off":
            return None
        if resume == "auto":
            found = self.latest()
            if found is None:
                log.info("no checkpoint under %s: starting from step 0", self.root)
            else:
                log.info("resuming from %s", found)
            return found
        return find_checkpoint(resume, key="trainer.resume")


def find_checkpoint(path: str | os.PathLike[str], *, key: str | None = None) -> Path:
    """The complete checkpoint at ``path``: a step directory, a checkpoint root or a run dir.

    ``key`` names the config key the path came from, for the error message.
    """
    where = f"{key}: " if key else ""
    p = Path(path)
    if not p.exists():
        msg = f"{where}checkpoint {p} does not exist"
        raise CheckpointError(msg)
    if step_of(p) is not None:
        if _is_complete(p):
            from rlcore.checkpoint.safe_load import require_intact

            return require_intact(p, where)
        msg = (
            f"{where}checkpoint {p} is incomplete (no {COMPLETE_MARKER} file): it was "
            "interrupted while being written; use an earlier one"
        )
        raise CheckpointError(msg)
    for root in (p, p / CHECKPOINTS_DIR):
        if root.is_dir():
            found = CheckpointManager(root).latest()
            if found is not None:
                return found
    msg = f"{where}no complete checkpoint (global_step_N directory) in {p}"
    raise CheckpointError(msg)


# --- driver state -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DriverState:
    """What the driver restores on resume (engine state lives in ``actor/``, ``critic/``)."""

    step: int
    dataloader: dict[str, int]
    extra: dict[str, Any] = attrs.Factory(dict)  # JSON-able: algorithm state, counters
    rng: dict[str, Any] | None = None  # capture_rng_state(); None when not saved


def capture_rng_state() -> dict[str, Any]:
    """Python ``random``, numpy's global RNG and torch's CPU (and CUDA) generator states.

    Only tensors, ints, strings, tuples and floats: loadable with ``weights_only=True``.
    """
    import random

    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": (int(version), tuple(int(x) for x in internal), gauss),
        # uint32 keys as int64: torch has no uint32 tensor loadable everywhere
        "numpy": (
            str(np_name),
            torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            int(np_pos),
            int(np_has_gauss),
            float(np_gauss),
        ),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng_state` (the CUDA part only where CUDA is initialised)."""
    import random

    import numpy as np
    import torch

    try:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        msg = f"RNG state is malformed ({type(err).__name__}: {err})"
        raise CheckpointError(msg) from err
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning(
                "CUDA RNG states of %d devices in the checkpoint, %d here: not restored",
                len(cuda),
                torch.cuda.device_count(),
            )


def save_driver_state(
    directory: str | os.PathLike[str],
    *,
    step: int,
    dataloader_state: Mapping[str, int],
    extra: Mapping[str, Any] | None = None,
    rng: Mapping[str, Any] | None = None,
) -> None:
    """Write ``trainer_state.json`` (+ ``rng_state.pt`` when ``rng`` is given) in ``directory``.

    ``extra`` must be JSON-serialisable (it is the algorithm's state, e.g. a KL coefficient).
    """
    import torch

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"step": int(step), "dataloader": dict(dataloader_state), "extra": dict(extra or {})}
    try:
        text = json.dumps(payload, indent=2, sort_keys=True)
    except TypeError as err:
        msg = f"driver state for step {step} is not JSON-serialisable: {err}"
        raise CheckpointError(msg) from err
    (out / STATE_FILE).write_text(text + "\n", encoding="utf-8")
    if rng is not None:
        torch.save(dict(rng), out / RNG_FILE)


def load_driver_state(directory: str | os.PathLike[str]) -> DriverState:
    """Read what :func:`save_driver_state` wrote; never unpickles arbitrary objects."""
    src = Path(directory)
    state_file = src / STATE_FILE
    try:
        payload = json.loads(state_file.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        msg = f"checkpoint {src} has no {STATE_FILE}"
        raise CheckpointError(msg) from err
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are both
        msg = f"cannot read {state_file}: {err}"
        raise CheckpointError(msg) from err
    try:
        step = int(payload["step"])
        dataloader = {str(k): int(v) for k, v in dict(payload["dataloader"]).items()}
        extra = dict(payload.get("extra") or {})
    except (KeyError, TypeError, ValueError) as err:
        msg = f"{state_file} lacks an integer step or a dataloader table: {err}"
        raise CheckpointError(msg) from err
    rng: dict[str, Any] | None = None
    rng_file = src / RNG_FILE
    if rng_file.is_file():
        rng = _load_plain_dict(rng_file, "a dict of RNG states")
    return DriverState(step=step, dataloader=dataloader, extra=extra, rng=rng)


# --- worker state ----------------------------------------------------------------------------


def worker_state_file(directory: str | os.PathLike[str], rank: int) -> Path:
    return Path(directory) / f"worker_state_rank{rank}.pt"


def save_worker_state(
    directory: str | os.PathLike[str], rank: int, state: Mapping[str, Any]
) -> None:
    """One rank's small state map (tensors, ints, floats, nested dicts only) under ``directory``."""
    import torch

    Path(directory).mkdir(parents=True, exist_ok=True)
    torch.save(dict(state), worker_state_file(directory, rank))


def load_worker_state(directory: str | os.PathLike[str], rank: int) -> dict[str, Any]:
    """What :func:`save_worker_state` wrote for ``rank``; never unpickles arbitrary objects."""
    file = worker_state_file(directory, rank)
    if not file.is_file():
        msg = f"checkpoint {directory} has no {file.name}: it was written by other ranks"
        raise CheckpointError(msg)
    return _load_plain_dict(file, "a dict")


def _load_plain_dict(file: Path, expected: str) -> dict[str, Any]:
    """``torch.load`` of a dict of tensors and plain values; ``expected`` names it in errors."""
    import pickle

    import torch

    try:
        # weights_only: tensors and plain containers only; a pickled object is refused.
        state = torch.load(file, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        msg = f"refusing to load {file}: not a plain tensor file ({first})"
        raise CheckpointError(msg) from err
    if not isinstance(state, dict):
        msg = f"{file} holds a {type(state).__name__}, expected {expected}"
        raise CheckpointError(msg)
    return state
