"""Worker classes for test_faults.py (module level so Ray imports them by reference)."""

from __future__ import annotations

import os
import time

from rlcore.dispatch import Dispatch, register
from rlcore.workers import Worker


class FaultWorker(Worker):
    def __init__(self, collective_timeout_s: float) -> None:
        super().__init__()
        # A run's workers take it from their spec (resources.collective_timeout_s).
        self.collective_timeout_s = collective_timeout_s

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self, _: int = 0) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_without(self, absent_rank: int) -> float:
        """Every rank but ``absent_rank`` enters an all-reduce that therefore never completes."""
        import torch
        import torch.distributed as dist

        self.init_process_group("gloo", timeout_s=self.collective_timeout_s)
        if self.rank == absent_rank:
            return 0.0
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wait_or_die(self, dying_rank: int) -> int:
        """``dying_rank`` is SIGKILLed by the test; the others block far longer than the test."""
        if self.rank == dying_rank:
            os.kill(os.getpid(), 9)
        time.sleep(600)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_with_stopped(self, stopped_rank: int) -> float:
        """``stopped_rank`` stops itself (SIGSTOP, heartbeat thread included) before an
        all-reduce the others then wait in until the collective timeout."""
        import signal

        import torch
        import torch.distributed as dist

        self.init_process_group("gloo", timeout_s=self.collective_timeout_s)
        if self.rank == stopped_rank:
            os.kill(os.getpid(), signal.SIGSTOP)
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t.item())
