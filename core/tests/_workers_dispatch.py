"""Worker classes for the dispatch and worker-group tests (module level so Ray imports them)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from rlcore.dispatch import Dispatch, DispatchCall, Execute, register, register_dispatch_mode
from rlcore.protocol import DataProto
from rlcore.workers import Worker

# pids of processes that unpickled a Tracer: shows where an intermediate value materialised.
UNPICKLED_PIDS: list[int] = []


class Tracer:
    """Records, in the unpickling process, that it was unpickled there."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __getstate__(self) -> dict[str, Any]:
        return {"value": self.value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.value = state["value"]
        UNPICKLED_PIDS.append(os.getpid())


# A custom mode: rank r gets (x, r); the driver gets the sum of the outputs.
def _dispatch_with_rank(call: DispatchCall, x: int):
    return ([(x, r) for r in range(call.world_size)],), {}


def _collect_sum(call: DispatchCall, outputs: list[Any]) -> int:
    return sum(outputs)


SUM_MODE = register_dispatch_mode("TEST_SUM_WITH_RANK", _dispatch_with_rank, _collect_sum)


def _collect_max(call: DispatchCall, outputs: list[Any]) -> int:
    return max(outputs)


# verl's inline form: dispatch_fn(worker_group, *args) and collect_fn(worker_group, outputs).
def verl_style_dispatch(worker_group: Any, x: int):
    return ([x + r for r in range(worker_group.world_size)],), {}


def verl_style_collect(worker_group: Any, outputs: list[Any]) -> list[Any]:
    return list(reversed(outputs))


# verl style: a lower-case name becomes the member Dispatch.TEST_MAX_WITH_RANK.
register_dispatch_mode("test_max_with_rank", _dispatch_with_rank, _collect_max)


class DispatchWorker(Worker):
    def __init__(self, offset: int = 0) -> None:
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag: str) -> tuple[int, str, int]:
        return self.rank, tag, self.world_size

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add_rank(self, x: int) -> int:
        return x + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def double(self, x: int) -> int:
        return 2 * x + self.offset

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data: DataProto, factor: float = 1.0) -> DataProto:
        x = data.batch["x"]  # (b,)
        return DataProto.from_dict(
            tensors={"y": x * factor, "rank": torch.full_like(x, self.rank)},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn: Any, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"y": fn(data.batch["x"])})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto) -> dict[str, Any]:
        return {"rank": self.rank, "rows": len(data), "sum": float(data.batch["x"].sum())}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self) -> tuple[int, int]:
        return self.rank, os.getpid()

    @register(dispatch_mode="TEST_SUM_WITH_RANK")
    def times_rank(self, pair: tuple[int, int]) -> int:
        x, r = pair
        assert r == self.rank
        return x * (r + 1)

    @register(dispatch_mode=Dispatch.TEST_MAX_WITH_RANK)
    def times_rank_max(self, pair: tuple[int, int]) -> int:
        x, r = pair
        return x * (r + 1)

    @register(dispatch_mode={"dispatch_fn": verl_style_dispatch, "collect_fn": verl_style_collect})
    def echo_inline(self, y: int) -> tuple[int, int]:
        return self.rank, y

    # --- futures ---------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def stamp(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        tracers = np.empty(len(x), dtype=object)
        tracers[:] = [Tracer(int(v)) for v in x]
        return DataProto.from_dict(tensors={"x": x + 100}, non_tensors={"tracer": tracers})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def consume(self, data: DataProto) -> DataProto:
        tracers = data.non_tensor_batch["tracer"]
        vals = torch.tensor([t.value for t in tracers])
        return DataProto.from_dict(
            tensors={"x": data.batch["x"], "orig": vals, "rank": torch.full_like(vals, self.rank)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def plus_one_async(self, x: int) -> int:
        return x + 1

    # --- environment -----------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "master": (self.master_addr, self.master_port),
            "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "pid": os.getpid(),
            "unpickled": list(UNPICKLED_PIDS),
        }
