"""What the megatron engine writes to disk: its checkpoints (this rank's model and optimizer
shards through torch.distributed.checkpoint, the counters as JSON, weights loaded across another
tensor/pipeline layout) and the Hugging Face export."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from rlcore.engine import TOKENIZER_FILES, copy_tokenizer_files
from rlcore_megatron.errors import MegatronError
from rlcore_megatron.mapping import ModelDims, megatron_names, merge_to_hf, shard_from_hf
from rlcore_megatron.mcore_optimizer import checkpoint_optimizer_mismatch, optimizer_kind

if TYPE_CHECKING:
    from rlcore_megatron.engine import MegatronEngine

log = logging.getLogger(__name__)

__all__ = ["engine_state", "export_engine", "load_engine", "save_engine"]

# The exported folder has no save_pretrained behind it: the generation config is copied too.
_EXPORTED_FILES = (*TOKENIZER_FILES, "generation_config.json")


def engine_state(engine: MegatronEngine) -> dict[str, Any]:
    """This rank's tensors, keyed so that equal keys hold equal tensors on every rank.

    Tensor-parallel shards carry their TP rank in the key; data-parallel replicas share
    keys, so torch.distributed.checkpoint writes each once.
    """
    tag = f"tp{engine.layout.tp_rank}"
    params = engine._local_params()
    state: dict[str, Any] = {f"model/{tag}/{n}": p.data for n, p in params.items()}
    if engine._mcore is not None:
        # Distributed optimizer: each data-parallel rank holds another shard.
        shard = f"/dp{engine.layout.dp_rank}" if engine._mcore.distributed else ""
        ids = {id(p): n for n, p in params.items()}
        state.update(engine._mcore.state(ids, f"optim/{tag}{shard}"))
    elif engine.optimizer is not None:
        ids = {id(p): n for n, p in params.items()}
        for p, slots in engine.optimizer.state.items():
            for key, value in slots.items():
                state[f"optim/{tag}/{ids[id(p)]}/{key}"] = value
    return state


def _extra_file(path: str) -> Path:
    # Counters and schedule are the same on every rank: rank 0 writes them.
    return Path(path) / "megatron_engine_state.json"


def save_engine(engine: MegatronEngine, path: str) -> None:
    """Model + optimizer shards (torch.distributed.checkpoint), counters as JSON."""
    Path(path).mkdir(parents=True, exist_ok=True)
    dcp.save(engine_state(engine), checkpoint_id=path)  # type: ignore[attr-defined]
    extra = {
        "global_step": engine.global_step,
        "skipped_steps": engine.skipped_steps,
        "layout": [engine.layout.tp, engine.layout.pp, engine.layout.dp],
        "optimizer": optimizer_kind(engine._mcore),
        "group_steps": engine._mcore.group_steps() if engine._mcore is not None else [],
    }
    if dist.get_rank() == 0:
        _extra_file(path).write_text(json.dumps(extra))
    dist.barrier()


def load_engine(engine: MegatronEngine, path: str) -> None:
    """What :func:`save_engine` wrote, into the live tensors (resharded when only the weights
    are loaded and the tensor/pipeline layout differs)."""
    extra_file = _extra_file(path)
    if not extra_file.is_file():
        msg = f"[{engine.spec.role}] no engine checkpoint at {path!r} (missing {extra_file.name})"
        raise MegatronError(msg)
    extra = json.loads(extra_file.read_text())
    # Data-parallel replicas share keys, so any dp loads; TP/PP shards do not reshard.
    layout = [engine.layout.tp, engine.layout.pp]
    if extra["layout"][:2] != layout and engine._guard is None:
        _load_resharded(engine, path, saved_tp=int(extra["layout"][0]))
        return
    if extra["layout"][:2] != layout:
        msg = (
            f"[{engine.spec.role}] checkpoint {path!r} was saved with tensor_parallel, "
            f"pipeline_parallel = {tuple(extra['layout'][:2])}; this run uses "
            f"{tuple(layout)} (resharding across TP/PP layouts is not supported yet)"
        )
        raise MegatronError(msg)
    if engine._guard is not None:
        kind = optimizer_kind(engine._mcore)
        problem = checkpoint_optimizer_mismatch(extra, engine.spec.role, kind, engine.layout.dp)
        if problem:
            raise MegatronError(f"[{engine.spec.role}] checkpoint {path!r}: {problem}")
    state = engine_state(engine)
    # In place: the tensors are the live ones.
    dcp.load(state, checkpoint_id=path)  # type: ignore[attr-defined]
    if engine._mcore is not None:
        engine._mcore.load_group_steps(extra.get("group_steps", []))
    if engine._guard is not None:  # an engine without an optimizer takes no steps
        engine._guard.load_state_dict(extra)


@torch.no_grad()
def _load_resharded(engine: MegatronEngine, path: str, *, saved_tp: int) -> None:
    """Weights only, from a checkpoint of another TP/PP layout (optimizer state is not).

    Every saved shard is read, merged into HF tensors (:func:`merge_to_hf`, the saved
    layout's vocabulary padding) and cut again for this rank (:func:`shard_from_hf`).
    Pipeline stages need nothing special: saved names use global layer numbers.
    """
    metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    saved: dict[str, Any] = {}
    for saved_name, meta in metadata.items():
        if saved_name.startswith("model/") and hasattr(meta, "size"):
            saved[saved_name] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    dcp.load(saved, checkpoint_id=path)  # type: ignore[attr-defined]
    saved_dims = ModelDims.from_hf_config(
        engine.hf_config, tp=saved_tp, value_head=engine.spec.value_head
    )
    full: dict[str, torch.Tensor] = {}
    for name in megatron_names(saved_dims):
        shards = [saved[f"model/tp{r}/{name}"] for r in range(saved_tp)]
        full.update(merge_to_hf(name, shards, saved_dims))
    for name, param in engine._local_params().items():
        shard = shard_from_hf(
            name, full, engine.dims, tp=engine.layout.tp, tp_rank=engine.layout.tp_rank
        )
        param.copy_(shard)
    log.info(
        "[%s] loaded the weights of %s (saved at tensor_parallel = %d) into tp = %d",
        engine.spec.role,
        path,
        saved_tp,
        engine.layout.tp,
    )


def _hf_state(engine: MegatronEngine) -> dict[str, torch.Tensor]:
    state = {}
    for name, tensor in engine.named_parameters_for_sync():
        if engine._tied_output and name == "lm_head.weight":
            continue  # transformers re-ties it; safetensors refuses shared storage
        state[name] = tensor.detach().to("cpu").contiguous().clone()
    return state


def export_engine(engine: MegatronEngine, path: str) -> None:
    """The whole model as a Hugging Face folder: rank 0 writes config, safetensors and the
    tokenizer files of ``model_path``."""
    from safetensors.torch import save_file

    state = _hf_state(engine)
    if dist.get_rank() == 0:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        config = engine.hf_config
        if engine.spec.value_head:
            config = type(config).from_dict(config.to_dict())
            config.num_labels = 1
            config.architectures = [
                f"{config.architectures[0].removesuffix('ForCausalLM')}ForTokenClassification"
            ]
        config.save_pretrained(out)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        copy_tokenizer_files(engine.spec.model_path, out, _EXPORTED_FILES)
    dist.barrier()
