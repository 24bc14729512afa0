"""What the trajectory queue holds at a checkpoint, written into it and read back safely.

An asynchronous run's checkpoint is written with batches generated ahead of the trainer
(:class:`rlcore.trainer.async_queue.TrajectoryQueue`): sampled with weights older than the
checkpoint's. Regenerating them on resume would sample them with the restored weights, so the
resumed steps would differ from the unbroken run's. Instead each queued generation is saved as
it came back from the rollout (responses, ``rollout_log_probs``, ``weight_version``, ...) and a
resumed run trains exactly those rows: with the loader, driver RNG, rollout counters and
weights that checkpoints already restore, the resumed run equals the unbroken one bit for bit
(``tests/test_resume_async.py``).

Layout, under the checkpoint's ``async_queue/``::

    queue.json      {"format": 1, "mode", "max_staleness", "batches": [{"file", "prompts",
                    "rows", "sampling", "weight_version"}, ...]}  (oldest batch first)
    batch_<i>.pt    the generation, :meth:`DataProto.save_to_disk` (tensors and plain values;
                    read with ``torch.load(weights_only=True)``, checked so before a resume)

The prompts are not saved: the dataloader's state in the checkpoint is the one from before the
oldest queued batch was taken, so the resumed run takes the same prompts again, in order, and
each is matched to its generation by a fingerprint (``prompts``: SHA-256 of the prompt token
ids, masks and uids). A saved generation is used only when its prompts, the number of rows and
the sampling settings are the resumed run's and the mode and staleness bound are unchanged;
otherwise (a changed config, a checkpoint written before the queue was saved) the prompts are
generated again with the restored weights, as before, and a warning says why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from rlcore.errors import DataProtoError

if TYPE_CHECKING:
    from rlcore.interfaces import SamplingParams
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = ["QUEUE_DIR", "SavedBatch", "load_queue", "prompts_fingerprint", "save_queue"]

QUEUE_DIR = "async_queue"


class QueueMode(Protocol):
    """What a saved queue records of :class:`rlcore.trainer.async_queue.AsyncSpec` (the queue
    imports this module, so it is named here by shape)."""

    @property
    def mode(self) -> str: ...

    @property
    def max_staleness(self) -> int: ...


INDEX_FILE = "queue.json"
_FORMAT = 1


@attrs.frozen(kw_only=True)
class SavedBatch:
    """One queued generation read back: for the loader batch whose fingerprint is
    ``prompts``, sampled with ``sampling`` (:func:`sampling_record`)."""

    prompts: str
    rows: int
    sampling: dict[str, Any]
    gen: DataProto

    def fits(self, prompts: DataProto, rows: int, sampling: SamplingParams) -> str | None:
        """Why this generation cannot stand for ``prompts`` expanded to ``rows`` rows and
        sampled with ``sampling`` in the resumed run; None when it can."""
        if prompts_fingerprint(prompts) != self.prompts:
            return "the loader gave other prompts than the ones it was generated for"
        if rows != self.rows or len(self.gen) != rows:
            return f"{self.rows} rows were generated, the resumed run expects {rows}"
        if sampling_record(sampling) != self.sampling:
            return "the sampling settings changed"
        return None


def sampling_record(sampling: SamplingParams) -> dict[str, Any]:
    """The sampling settings as a JSON-able table (compared on resume)."""
    return dict(attrs.asdict(sampling))


def prompts_fingerprint(prompts: DataProto) -> str:
    """SHA-256 of a loader batch's prompt tokens, masks and uids: the same prompts in the
    same order give the same string in every process."""
    import numpy as np

    digest = hashlib.sha256()
    for key in ("input_ids", "attention_mask"):
        if key in prompts.batch:
            tensor = prompts.batch[key].detach().cpu().contiguous()
            digest.update(f"{key}{tuple(tensor.shape)}{tensor.dtype}".encode())
            digest.update(tensor.numpy().tobytes())
    uids = prompts.non_tensor_batch.get("uid")
    if uids is not None:
        digest.update(json.dumps([str(u) for u in np.asarray(uids).tolist()]).encode())
    return digest.hexdigest()


def save_queue(
    directory: Path,
    spec: QueueMode,
    batches: list[tuple[DataProto, SamplingParams, DataProto]],
) -> None:
    """Write ``(prompts, sampling, generation)`` of each queued batch, oldest first, under
    ``directory/async_queue``; nothing when the queue is empty.

    A generation holding a value :meth:`DataProto.save_to_disk` refuses (an agent's custom
    object) is not saved: a warning names it and a resume generates the queue again.
    """
    if not batches:
        return
    folder = directory / QUEUE_DIR
    folder.mkdir()
    entries = []
    try:
        for i, (prompts, sampling, gen) in enumerate(batches):
            file = f"batch_{i}.pt"
            gen.save_to_disk(folder / file)
            versions = gen.non_tensor_batch.get("weight_version")
            entries.append(
                {
                    "file": file,
                    "prompts": prompts_fingerprint(prompts),
                    "rows": len(gen),
                    "sampling": sampling_record(sampling),
                    "weight_version": None if versions is None else int(min(versions)),
                }
            )
    except DataProtoError as err:
        shutil.rmtree(folder)
        log.warning("the queued generations are not saved (%s): a resume generates them again", err)
        return
    index = {
        "format": _FORMAT,
        "mode": spec.mode,
        "max_staleness": spec.max_staleness,
        "batches": entries,
    }
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")


def load_queue(directory: Path, spec: QueueMode) -> list[SavedBatch]:
    """The generations :func:`save_queue` wrote under checkpoint ``directory``, oldest first;
    none when it holds no queue or one of another mode or bound (a warning says so)."""
    from rlcore.checkpoint import CheckpointError
    from rlcore.protocol import DataProto

    index_file = directory / QUEUE_DIR / INDEX_FILE
    if not index_file.is_file():
        return []
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        entries = [dict(e) for e in index["batches"]]
        mode, bound = str(index["mode"]), int(index["max_staleness"])
        if index.get("format") != _FORMAT:
            msg = f"format {index.get('format')!r}, this rlcore reads {_FORMAT}"
            raise ValueError(msg)
        files = [str(e["file"]) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as err:
        msg = f"{index_file} is unreadable ({type(err).__name__}: {err}); use an earlier checkpoint"
        raise CheckpointError(msg) from err
    if (mode, bound) != (spec.mode, spec.max_staleness):
        log.warning(
            "the checkpoint's queued generations were made under async_mode %r, max_staleness "
            "%d (now %r, %d): generating them again with the restored weights",
            mode,
            bound,
            spec.mode,
            spec.max_staleness,
        )
        return []
    out = []
    for entry, file in zip(entries, files, strict=True):
        path = directory / QUEUE_DIR / file
        if Path(file).name != file:
            msg = f"{index_file} names {file!r}, outside {path.parent}"
            raise CheckpointError(msg)
        try:
            gen = DataProto.load_from_disk(path)
        except DataProtoError as err:
            raise CheckpointError(f"{err}; use an earlier checkpoint") from err
        out.append(
            SavedBatch(
                prompts=str(entry["prompts"]),
                rows=int(entry["rows"]),
                sampling=dict(entry["sampling"]),
                gen=gen,
            )
        )
    return out
