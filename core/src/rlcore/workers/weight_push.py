"""The actor's weights into the rollout of the same process (the colocated policy worker).

:func:`push_weights` picks the cheapest way the pair allows: the LoRA adapter alone (a rollout
that serves adapters); the engine's live tensors, shared without a copy
(:meth:`BaseEngine.shared_parameters_for_sync` + :meth:`BaseRollout.share_weights`: one rank
holding whole parameters in the rollout's dtype and device, 0 bytes); else the full tensors
streamed once each (:meth:`BaseEngine.named_parameters_for_sync`, gathered across ranks, cast,
or merged under LoRA). The rollout on a pool of its own gets them over
:mod:`rlcore.workers.weight_bridge` instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import BaseEngine, BaseRollout

__all__ = ["SeenTensors", "push_weights"]


class SeenTensors:
    """Tells a tensor object already met in one sync (a tied weight streamed under its second
    name) from a new one, without keeping any alive: a freed tensor's id may be reused."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}

    def first_time(self, tensor: torch.Tensor) -> bool:
        ref = self._refs.get(id(tensor))
        if ref is not None and ref() is tensor:
            return False
        self._refs[id(tensor)] = weakref.ref(tensor)
        return True


def push_weights(actor: BaseEngine, rollout: BaseRollout) -> int:
    """Hand the actor's current weights to the rollout (every rank: gathering is collective).

    Returns the bytes of tensor data handed over (``perf/weight_sync_bytes``), each tensor
    counted once (tied weights come under both names as one tensor): 0 when the rollout
    shares the actor's storage.
    """
    sent = [0]
    seen = SeenTensors()

    def counted(stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in stream:
            if seen.first_time(tensor):
                sent[0] += tensor.numel() * tensor.element_size()
            yield name, tensor

    serves_adapters = type(rollout).traits(rollout.config).lora_adapters
    adapter = actor.adapter_for_sync() if serves_adapters else None
    if adapter is not None:
        adapter_config, tensors = adapter
        rollout.update_adapter(adapter_config, counted(tensors))
        return sent[0]
    shared = actor.shared_parameters_for_sync()
    if shared is not None and rollout.share_weights(shared):
        return 0
    rollout.update_weights(counted(actor.named_parameters_for_sync()))
    return sent[0]
