"""Validators of :class:`rlcore_megatron.engine.MegatronEngine.Config`'s keys."""

from __future__ import annotations

from typing import Any

__all__ = ["LORA_UNSUPPORTED", "no_lora", "positive"]


def positive(instance: Any, attribute: Any, value: int) -> None:
    if value < 1:
        msg = f"{attribute.name} must be >= 1, got {value}"
        raise ValueError(msg)


# rlcore-fsdp2's LoRA options (verl's names) and their "off" values: accepted here only to say,
# in one line on the first one set, that this engine has no LoRA yet.
_LORA_OFF: dict[str, Any] = {
    "lora_rank": 0,
    "lora_alpha": None,
    "lora_dropout": None,
    "target_modules": None,
    "exclude_modules": None,
}
LORA_UNSUPPORTED = (
    'LoRA is not supported in rlcore-megatron yet; train LoRA with name = "fsdp2" in this '
    "table (pip install 'rlcore-fsdp2[lora]'), or remove the LoRA options"
)


def no_lora(instance: Any, attribute: Any, value: Any) -> None:
    if value == _LORA_OFF[attribute.name]:
        return
    first = next(k for k, off in _LORA_OFF.items() if getattr(instance, k) != off)
    if attribute.name == first:  # one line, on the first LoRA key the user set
        raise ValueError(LORA_UNSUPPORTED)
