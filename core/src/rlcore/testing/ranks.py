"""A script started once per rank of a local ``torch.distributed`` group, for tests.

The engines' multi-process tests run a worker script as N processes (``RANK``, ``WORLD_SIZE``
and a loopback ``MASTER_ADDR``/``MASTER_PORT``, one torch thread each, as ``torchrun`` would
set them) while the test computes a 1-process reference, then compare the two::

    with Ranks([sys.executable, str(WORKER), model_path, str(out)]) as ranks:
        reference = run_one_process(...)
        ranks.wait(timeout=300)

Leaving the block kills whatever is still running, so a failed assertion leaves no process.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from types import TracebackType

from rlcore.workers.worker import find_free_port

__all__ = ["Ranks"]


class Ranks:
    """``argv`` started as ranks 0..``world_size``-1 of one group on loopback."""

    def __init__(
        self, argv: Sequence[str], *, world_size: int = 2, env: dict[str, str] | None = None
    ) -> None:
        self.argv = [str(a) for a in argv]
        port = str(find_free_port())
        self.procs = [
            subprocess.Popen(
                self.argv,
                env={
                    **os.environ,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "OMP_NUM_THREADS": "1",
                    **(env or {}),
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(world_size)
        ]

    def wait(self, timeout: float) -> list[str]:
        """Each rank's output, once all have exited 0 within ``timeout`` seconds each; else an
        ``AssertionError`` naming the rank, with the end of its output."""
        outputs = []
        for rank, proc in enumerate(self.procs):
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                msg = f"rank {rank} of {self.argv[1:2]} still running after {timeout:.0f} s"
                raise AssertionError(msg) from None
            assert proc.returncode == 0, f"rank {rank} failed:\n{out[-4000:]}"
            outputs.append(out)
        return outputs

    def __enter__(self) -> Ranks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
