"""Worker classes for the worker-group tests (module level so Ray imports them)."""

from __future__ import annotations

import os
from typing import Any

import torch
from _workers_dispatch import DispatchWorker

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.protocol import DataProto
from rlcore.workers import Worker


class DistWorker(DispatchWorker):
    """Inherits DispatchWorker's registered methods: the group finds them along the MRO."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def maybe_fail(self, bad_rank: int) -> int:
        if self.rank == bad_rank:
            msg = f"boom on rank {self.rank}"
            raise ValueError(msg)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def refuse(self, bad_rank: int) -> int:
        """What only a worker can check, refused on purpose: a one-line ``ConfigError``."""
        if self.rank == bad_rank:
            from rlcore.errors import ConfigError

            msg = f"[actor.engine] some_key = 3 cannot run on rank {self.rank}; set 1"
            raise ConfigError(msg)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        self.init_process_group("gloo")
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())


class MeshWorker(Worker):
    """dp x tp layout: rank = dp_rank * tp + tp_rank; tp rank 0 returns the data.

    A second mesh, "rollout", treats every rank as data-parallel.
    """

    def __init__(self, tp: int = 2) -> None:
        super().__init__()
        self.tp_rank = self.rank % tp
        self.set_dispatch_info(
            dp_rank=self.rank // tp, dp_size=self.world_size // tp, is_collect=self.tp_rank == 0
        )
        self.set_dispatch_info(mesh="rollout", dp_rank=self.rank, dp_size=self.world_size)
        self.seen: list[list[float]] = []

    @register(dispatch_mode=Dispatch.MESH_COMPUTE_PROTO)
    def forward(self, data: DataProto) -> DataProto:
        x = data.batch["x"]  # (b,)
        self.seen.append(x.tolist())
        # tp ranks other than 0 return garbage on purpose: it must not be collected
        y = x * 2 if self.tp_rank == 0 else torch.full_like(x, -1.0)
        return DataProto.from_dict(tensors={"y": y, "rank": torch.full_like(x, self.rank)})

    @register(dispatch_mode=Dispatch.MESH_COMPUTE)
    def mesh_items(self, item: Any) -> tuple[Any, int]:
        return item, self.rank

    @register(dispatch_mode=mesh_dispatch_mode("rollout"), blocking=False)
    def generate(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        return DataProto.from_dict(
            tensors={"x": x + 1000, "gen_rank": torch.full_like(x, self.rank)}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_seen(self) -> list[list[float]]:
        seen, self.seen = self.seen, []
        return seen


class ActorRole(Worker):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> tuple[int, int, float]:
        return os.getpid(), self.rank, self.lr

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        return DataProto.from_dict(
            tensors={"x": x * self.lr, "rank": torch.full_like(x, self.rank)}
        )


class RefRole(Worker):
    def __init__(self) -> None:
        super().__init__()
        # the reference role keeps whole copies on every rank: one data-parallel group
        self.set_dispatch_info(dp_rank=0, dp_size=1, is_collect=self.rank == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> tuple[int, int]:
        return os.getpid(), self.rank

    @register(dispatch_mode=Dispatch.MESH_COMPUTE_PROTO)
    def ref_log_prob(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        return DataProto.from_dict(tensors={"ref": -x, "rank": torch.full_like(x, self.rank)})
