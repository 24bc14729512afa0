"""The keys of the megatron engine's table (``[actor.engine]`` with ``name = "megatron"``): its
parallel sizes, the distributed optimizer, and the LoRA keys it accepts only to refuse them."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.interfaces import BaseEngine, key
from rlcore_megatron.config_checks import no_lora, positive

__all__ = ["MegatronOptions"]


@attrs.frozen(kw_only=True)
class MegatronOptions(BaseEngine.Config):
    """The keys of ``[actor.engine]`` (also ``[critic.engine]``, ``[ref.engine]``) with
    ``name = "megatron"``; :class:`MegatronEngine.Config` is this class."""

    tensor_parallel: int = key(
        1,
        "Tensor-parallel size (ranks one layer is split over).",
        validator=positive,
        allowed=">= 1",
    )
    pipeline_parallel: int = key(
        1,
        "Pipeline-parallel size (stages the layers are split into).",
        validator=positive,
        allowed=">= 1",
    )
    sequence_parallel: bool = key(
        False,
        "Shard activations of norms/dropout along the sequence over the "
        "tensor-parallel group; not supported yet (megatron-core's local spec uses "
        "torch's RMSNorm): must stay false.",
        allowed="false",
    )

    use_distributed_optimizer: bool = key(
        False,
        "Train with megatron-core's DistributedDataParallel and DistributedOptimizer: "
        "float32 main parameters and Adam moments sharded over the data-parallel ranks "
        "(ZeRO-1), gradients reduce-scattered from megatron's grad buffers. With "
        'model.dtype = "bfloat16" the model computes in bfloat16 (on GPU that happens '
        "without this key too); checkpoints then reload at the same data-parallel size.",
    )

    # Not supported: set, they fail validation with LORA_UNSUPPORTED (config_checks).
    lora_rank: int = key(
        0,
        "Not supported by this engine (accepted only to say so): any value but 0 fails validation.",
        validator=no_lora,
        allowed="0",
    )
    lora_alpha: float | None = key(
        None,
        "Not supported by this engine: setting it fails validation.",
        validator=no_lora,
        allowed="unset",
    )
    lora_dropout: float | None = key(
        None,
        "Not supported by this engine: setting it fails validation.",
        validator=no_lora,
        allowed="unset",
    )
    target_modules: str | tuple[str, ...] | None = key(
        None,
        "Not supported by this engine: setting it fails validation.",
        validator=no_lora,
        allowed="unset",
    )
    exclude_modules: tuple[str, ...] | None = key(
        None,
        "Not supported by this engine: setting it fails validation.",
        validator=no_lora,
        allowed="unset",
    )

    @sequence_parallel.validator
    def _check_sequence_parallel(self, attribute: Any, value: bool) -> None:
        # megatron-core 0.16.1's local layer spec (the one model.py builds) takes its RMSNorm
        # from LocalSpecProvider.layer_norm, always WrappedTorchNorm
        # (megatron/core/models/backends.py:104-111), which asserts
        # `not config.sequence_parallel` (megatron/core/transformer/torch_norm.py:32);
        # apex does not help: its FusedLayerNorm is LayerNorm only
        # (megatron/core/fusions/fused_layer_norm.py:66-68).
        if value:
            msg = (
                "sequence_parallel = true is not supported: megatron-core's local layer spec "
                "uses torch's RMSNorm, which refuses sequence parallelism; set it to false"
            )
            raise ValueError(msg)
