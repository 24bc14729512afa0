"""A megatron-core ``GPTModel`` (one pipeline stage, one tensor-parallel shard) from an HF folder.

``build_model`` reads the HF config, builds the stage's ``GPTModel`` with the local layer spec
(pure PyTorch modules: the same code on CPU and GPU, and the parameter names
:mod:`rlcore_megatron.mapping` knows) and loads the HF safetensors into it, converting QKV,
gate/up, vocabulary padding and tied embeddings on the way. Requires
``parallel_state.initialize_model_parallel`` to have run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import torch

from rlcore.engine import dtype_from_name
from rlcore_megatron.mapping import MappingError, ModelDims, shard_from_hf

__all__ = [
    "ValueHead",
    "build_model",
    "global_name",
    "hf_reader",
    "layer_offset",
    "local_name",
    "transformer_config",
]


class ValueHead(torch.nn.Linear):
    """The critic's scalar head in place of ``output_layer`` (same call signature, (out, None)).

    Replicated over tensor-parallel ranks: its input (the final hidden states) is identical
    on every rank without sequence parallelism, so its gradients agree without a reduction.
    """

    def forward(  # type: ignore[override]
        self,
        input: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, None]:
        return super().forward(input), None


def _rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        msg = f"the megatron engine supports plain RoPE only; this model uses rope_type={kind!r}"
        raise MappingError(msg)
    theta = getattr(hf_config, "rope_theta", None) or params.get("rope_theta") or 10000.0
    return float(theta)


def transformer_config(
    hf_config: Any,
    *,
    tp: int,
    pp: int,
    sequence_parallel: bool,
    dtype: str,
    on_cpu: bool,
    recompute: bool,
) -> Any:
    """megatron's ``TransformerConfig`` equivalent to a Qwen2/Llama HF config.

    Every fused kernel is off on CPU (they are CUDA extensions); the pipeline schedule is told
    that micro-batch lengths vary and that losses are already normalised per token.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    dims = ModelDims.from_hf_config(hf_config, tp=tp)
    torch_dtype = dtype_from_name(dtype)
    extra: dict[str, Any] = {}
    if recompute:
        extra.update(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    return TransformerConfig(
        num_layers=dims.layers,
        hidden_size=dims.hidden,
        num_attention_heads=dims.heads,
        num_query_groups=dims.kv_heads,
        kv_channels=dims.head_dim,
        ffn_hidden_size=dims.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=float(hf_config.rms_norm_eps),
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sequence_parallel,
        params_dtype=torch_dtype,
        pipeline_dtype=torch_dtype,
        bf16=torch_dtype == torch.bfloat16,
        fp16=torch_dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is loaded from the HF checkpoint
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        batch_p2p_comm=not on_cpu,  # gloo has no batched isend/irecv
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",  # dense model; "allgather" rejects the above
        calculate_per_token_loss=True,
        **extra,
    )


def layer_offset(config: Any) -> int:
    """Global number of this pipeline stage's first decoder layer."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return int(get_transformer_layer_offset(config))


def global_name(local: str, offset: int) -> str:
    """``decoder.layers.{j}.x`` of a stage -> ``decoder.layers.{offset + j}.x``."""
    if local.startswith("decoder.layers."):
        _, _, j, rest = local.split(".", 3)
        return f"decoder.layers.{offset + int(j)}.{rest}"
    return local


def local_name(name: str, offset: int) -> str:
    """The inverse of :func:`global_name`."""
    if name.startswith("decoder.layers."):
        _, _, i, rest = name.split(".", 3)
        return f"decoder.layers.{int(i) - offset}.{rest}"
    return name


@attrs.frozen
class _Reader:
    get: Callable[[str], torch.Tensor]
    names: frozenset[str]


def hf_reader(model_path: str, stack: ExitStack) -> _Reader:
    """A lazy name -> tensor reader over an HF folder's safetensors (single or sharded)."""
    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (root / "model.safetensors").is_file():
        files, weight_map = ["model.safetensors"], {}
    else:
        msg = (
            f"model_path={model_path!r} has no model.safetensors(.index.json): the megatron "
            "engine reads safetensors only (re-save the model with safe_serialization=True)"
        )
        raise MappingError(msg)
    handles = {f: stack.enter_context(safe_open(str(root / f), framework="pt")) for f in files}
    if not weight_map:
        weight_map = {k: files[0] for k in handles[files[0]].keys()}  # noqa: SIM118

    def get(name: str) -> torch.Tensor:
        if name not in weight_map:
            msg = f"{model_path}: the checkpoint has no tensor {name!r}"
            raise MappingError(msg)
        tensor: torch.Tensor = handles[weight_map[name]].get_tensor(name)
        return tensor

    return _Reader(get=get, names=frozenset(weight_map))


def build_model(
    hf_config: Any,
    config: Any,
    *,
    model_path: str,
    value_head: bool,
    seed: int,
    device: torch.device,
) -> tuple[torch.nn.Module, ModelDims]:
    """This rank's ``GPTModel`` stage with the HF weights of ``model_path`` loaded."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    tp = config.tensor_model_parallel_size
    dims = ModelDims.from_hf_config(hf_config, tp=tp, value_head=value_head)
    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=dims.padded_vocab,
        max_sequence_length=int(hf_config.max_position_embeddings),
        pre_process=pre,
        post_process=post,
        parallel_output=True,
        share_embeddings_and_output_weights=dims.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf_config),
    )
    if value_head and post:
        model.output_layer = ValueHead(dims.hidden, 1, dtype=config.params_dtype)
    _mark_tensor_parallel(model)
    model.to(device)
    _load_hf_weights(model, dims, model_path, config, hf_config, seed=seed)
    return model, dims


def _mark_tensor_parallel(model: torch.nn.Module) -> None:
    """Set megatron's ``tensor_model_parallel``/``partition_dim`` on every split weight.

    megatron-core 0.16 sets them on weights only inside its initialisers, which
    ``perform_initialization=False`` skips (biases get them regardless); gradient-norm and
    weight-gathering code reads them.
    """
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for module in model.modules():
        if isinstance(module, ColumnParallelLinear | VocabParallelEmbedding):
            dim = 0
        elif isinstance(module, RowParallelLinear):
            dim = 1
        else:
            continue
        weight = getattr(module, "weight", None)
        if weight is not None:
            set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=dim, stride=1)


def _local_params(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not name.endswith("_extra_state"):
            yield name, tensor


@torch.no_grad()
def _load_hf_weights(
    model: torch.nn.Module,
    dims: ModelDims,
    model_path: str,
    config: Any,
    hf_config: Any,
    *,
    seed: int,
) -> None:
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    offset = layer_offset(config)
    with ExitStack() as stack:
        reader = hf_reader(model_path, stack)
        for local, param in _local_params(model):
            name = global_name(local, offset)
            if dims.value_head and name.startswith("output_layer."):
                hf_name = f"score.{name.removeprefix('output_layer.')}"
                if hf_name in reader.names:
                    param.copy_(reader.get(hf_name))
                else:
                    _init_value_head(param, name, hf_config, seed)
                continue
            if (
                name == "output_layer.weight"
                and not dims.tie_embeddings
                and "lm_head.weight" not in reader.names
            ):
                msg = f"{model_path}: no lm_head.weight and tie_word_embeddings is false"
                raise MappingError(msg)
            shard = shard_from_hf(
                name, reader.get, dims, tp=config.tensor_model_parallel_size, tp_rank=tp_rank
            )
            if shard.shape != param.shape:
                msg = f"{name}: mapped shape {tuple(shard.shape)} != model's {tuple(param.shape)}"
                raise MappingError(msg)
            param.copy_(shard)


def _init_value_head(param: torch.Tensor, name: str, hf_config: Any, seed: int) -> None:
    """A fresh value head as transformers initialises ``score`` (normal, zero bias), seeded."""
    if name.endswith(".bias"):
        param.zero_()
        return
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(hf_config, "initializer_range", 0.02))
    param.copy_(torch.randn(param.shape, generator=generator) * std)
