"""Worker classes for the shared-pool, timeout and async tests (module level: Ray imports them)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from rlcore.dispatch import Dispatch, register
from rlcore.workers import Worker


class SideWorker(Worker):
    """Reports where it runs and what Ray gave it."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "role": self.role,
            "rank": self.rank,
            "pid": os.getpid(),
            "pg": ctx.get_placement_group_id(),
            "cpus": ctx.get_assigned_resources().get("CPU", 0.0),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def busy(self, seconds: float) -> tuple[float, float]:
        """Sleep and report the wall-clock interval, to show two groups overlapping."""
        start = time.time()
        time.sleep(seconds)
        return start, time.time()


class HangWorker(Worker):
    """A method that never returns (within any test's patience)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hang(self) -> None:
        time.sleep(3600)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def hang_later(self) -> None:
        time.sleep(3600)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


class SlowInitWorker(Worker):
    """An ``__init__`` that takes far longer than the test's start timeout."""

    def __init__(self) -> None:
        super().__init__()
        time.sleep(3600)


class AsyncRole(Worker):
    """A role with ``async def`` methods (awaited by Ray in a plain group)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def agen(self, x: int) -> int:
        await asyncio.sleep(0.01)
        return x * 10 + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_rank(self) -> int:
        return self.rank


class Blocker:
    """A plain Ray actor that holds resources in a pool's bundle (another job's actor)."""

    def ready(self) -> bool:
        return True
