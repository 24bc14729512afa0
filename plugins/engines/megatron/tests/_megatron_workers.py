"""Workers holding a MegatronEngine, for the mesh-dispatch test (module level: Ray imports it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from rlcore.dispatch import DISPATCH_ATTR, Dispatch, get_method_spec, register
from rlcore.interfaces import EngineSpec
from rlcore.protocol import DataProto
from rlcore.roles.critic import CriticWorker
from rlcore.workers import Worker

F = TypeVar("F", bound=Callable[..., Any])


class MegatronLogProbWorker(Worker):
    """Builds a reference engine with the given layout and registers its mesh place."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Any = None
        self.received: list[dict[str, Any]] = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, model_path: str, tensor_parallel: int) -> dict[str, Any]:
        from rlcore_megatron.engine import MegatronEngine

        self.init_process_group("gloo")
        spec = EngineSpec(role="ref", model_path=model_path, micro_batch_size=2)
        self.engine = MegatronEngine(spec, MegatronEngine.Config(tensor_parallel=tensor_parallel))
        info = attrs.asdict(self.engine.dispatch_info())
        self.set_dispatch_info(**info)
        return info

    @register(dispatch_mode=Dispatch.MESH_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        self.received.append(
            {
                "rows": data.batch["input_ids"][:, 0].tolist(),  # identifies the shard
                "bytes": sum(t.numel() * t.element_size() for t in data.batch.values()),
            }
        )
        out = self.engine.compute_log_prob(data, temperature=1.0)
        return DataProto.from_dict(tensors={"ref_log_prob": out.log_probs})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_received(self) -> list[dict[str, Any]]:
        received, self.received = self.received, []
        return received


def _dispatch_of(base: Callable[..., Any]) -> Callable[[F], F]:
    """Give an override the base method's registered dispatch (exactly the role's)."""
    spec = get_method_spec(base)

    def mark(fn: F) -> F:
        setattr(fn, DISPATCH_ATTR, spec)
        return fn

    return mark


class RecordingCriticWorker(CriticWorker):
    """rlcore's real ``CriticWorker``, noting what each rank received (same dispatch modes)."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.received: list[dict[str, Any]] = []

    def _note(self, method: str, data: DataProto) -> None:
        self.received.append(
            {
                "method": method,
                "rows": data.batch["input_ids"][:, 0].tolist(),
                "bytes": sum(t.numel() * t.element_size() for t in data.batch.values()),
            }
        )

    @_dispatch_of(CriticWorker.compute_values)
    def compute_values(self, data: DataProto) -> DataProto:
        self._note("compute_values", data)
        return super().compute_values(data)

    @_dispatch_of(CriticWorker.update_critic)
    def update_critic(self, data: DataProto, step: int) -> DataProto:
        self._note("update_critic", data)
        return super().update_critic(data, step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_received(self) -> list[dict[str, Any]]:
        received, self.received = self.received, []
        return received
