"""Compiling a decoding shape in a separate process while the rollout decodes eagerly.

Why: a new shape of the compiled decoding step (:mod:`rlcore_hf.compiled_decode`) costs ~25 s
on one CPU core in a fresh process, most of it g++ building ~20 C++ kernels, and the rollout
would wait for it. With inductor's on-disk cache holding those kernels the same compile takes
~3.5 s (measured on the quickstart's model, 256 rows x 64 positions: 26.5 s cold, 3.5 s warm).
So the rollout starts this module as a child process, which loads the same model folder the
same way, compiles the same shape into the shared cache and exits; meanwhile the rollout keeps
decoding with ``generate``. Once the child is done, the rollout compiles the shape itself,
from the cache. The child runs at SCHED_IDLE on whatever CPU time the run leaves idle (on
the 2-core machine the driver leaves most of a core), not in a thread of the rollout: dynamo
in a second thread held the GIL for seconds (one eager call 0.8 -> 6.2 s) and tripped over
transformers' context variables (tried).

The parent's side is :class:`WarmupProcess` (run by the rollout's process); the child's is
:func:`main` (``python -m rlcore_hf.compile_warmup JSON``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import IO, Literal

__all__ = ["WARMUP_TIMEOUT_S", "WarmupProcess", "WarmupSpec", "main"]

log = logging.getLogger(__name__)

# A cold compile of one shape took 26.5 s idle, 28-45 s beside a quickstart run; past this
# bound the child is killed and the rollout compiles in its own process, as without a warm-up.
WARMUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class WarmupSpec:
    """How the rollout loaded its model (the child loads it the same way: the same graph)."""

    model_path: str
    dtype: str
    trust_remote_code: bool
    attn_implementation: str


class WarmupProcess:
    """One child compiling one shape (rows, prompt width, new tokens) into inductor's cache."""

    def __init__(self, spec: WarmupSpec, rows: int, width: int, new: int, mask_dtype: str) -> None:
        self.shape = f"{rows} rows x {width}+{new} positions"
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115  # closed by poll()
        args = {**asdict(spec), "rows": rows, "width": width, "new": new, "mask_dtype": mask_dtype}
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._proc = subprocess.Popen(  # our own module, our own arguments
            [sys.executable, "-m", "rlcore_hf.compile_warmup", json.dumps(args)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr, env=env,
        )  # fmt: skip
        self._start = time.monotonic()
        self.seconds = 0.0

    def poll(self) -> Literal["running", "done", "failed"]:
        """Never waits: ``running``, ``done`` (the cache holds the shape) or ``failed``
        (logged once, with the child's last line; the rollout compiles the shape itself)."""
        code = self._proc.poll()
        self.seconds = time.monotonic() - self._start
        if code is None and self.seconds < WARMUP_TIMEOUT_S:
            return "running"
        if code is None:
            self.kill()
            self._stderr.close()
            log.warning(
                "rollout.compile_decode: the background compile of %s ran past %.0f s and was "
                "stopped; compiling it in the rollout's process", self.shape, WARMUP_TIMEOUT_S,
            )  # fmt: skip
            return "failed"
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip().splitlines()
        self._stderr.close()
        if code == 0:
            return "done"
        log.warning(
            "rollout.compile_decode: the background compile of %s failed (exit %d: %s); "
            "compiling it in the rollout's process", self.shape, code,
            tail[-1] if tail else "no output",
        )  # fmt: skip
        return "failed"

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    """The child: load the model as the rollout did, compile one shape, exit."""
    import torch

    from rlcore_hf.compiled_decode import (
        DECODE_ATTENTION,
        CompiledDecoder,
        attention_for_compiled_decode,
    )
    from rlcore_hf.rollout import load_model

    args = json.loads(argv[0])
    _exit_with_parent()
    _run_when_idle()
    torch.set_num_threads(1)
    attn = args["attn_implementation"]
    if attn == DECODE_ATTENTION:
        attn = attention_for_compiled_decode()  # registers it with transformers in this process
    model = load_model(args["model_path"], args["dtype"], args["trust_remote_code"], attn).eval()
    decoder = CompiledDecoder(model)
    with torch.no_grad():
        decoder.compile_shape(
            args["rows"], args["width"], args["new"], getattr(torch, args["mask_dtype"])
        )
    return 0


def _run_when_idle() -> None:
    """SCHED_IDLE for this child and the g++ runs it starts: they take only CPU time nothing
    else wants, so the run's own processes come first. (``nice`` does not do this on Linux
    with autogroups, and Ray's workers run at nice 15 already.) On the 2-core machine the
    quickstart's steps while the child compiled averaged about eager's at either priority
    (README, "A whole quickstart run with compiled decoding")."""
    if hasattr(os, "SCHED_IDLE"):
        # Not allowed here: compile at the inherited priority.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _exit_with_parent() -> None:
    """A daemon thread ending this child once its parent (the rollout's process) is gone, so a
    killed worker leaves no compile behind."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="compile-warmup-parent-watch", daemon=True).start()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as err:  # one line for the parent's warning (it reads the last line)
        print(f"{type(err).__name__}: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(1)
