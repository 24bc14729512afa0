"""``RolloutWorker``: the rollout as a worker group of its own, on its own resource pool.

With ``[resources] placement = { rollout = "gen" }`` the policy worker holds the actor (and
reference) only, and this worker, placed on ``[resources.pools.gen]``, holds the rollout
engine (and the agent loop with ``[agent]``). Its data-parallel size is its pool's process
count, independent of the trainer's: ``generate_sequences`` splits the prompts over the
rollout's own ranks (the ``rollout`` mesh, as in the policy worker).

Weights arrive over a :class:`~rlcore.workers.weight_bridge.WeightBridge` (trainer rank 0 to
every rollout rank) after each actor update. Every generated row records the version it was
sampled with in ``non_tensor_batch["weight_version"]`` (int64): 0 is the weights the run
started from, each sync adds one.

Undecorated and importable from this module: the worker group applies ``ray.remote`` where
it places it (Ray cannot pickle by value a class that touches torch.distributed).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.roles.policy import WeightBridgeEnd, build_rollout
from rlcore.roles.update import clock, summed
from rlcore.tracking.metrics import peak_rss_gb
from rlcore.tracking.reductions import SUM, declare_reduction

if TYPE_CHECKING:
    from rlcore.agent.harness import HarnessLoop
    from rlcore.agent.loop import AgentLoop
    from rlcore.interfaces import BaseRollout, SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.roles.specs import RolloutWorkerSpec

log = logging.getLogger(__name__)

__all__ = [
    "ROLLOUT_SUBDIR",
    "TOKEN_WEIGHT_VERSIONS_KEY",
    "WEIGHT_VERSION_KEY",
    "RolloutWorker",
    "sample_versions",
]

WEIGHT_VERSION_KEY = "weight_version"
# Partial rollouts (rollout.partial_rollouts): batch["token_weight_versions"], response-shaped
# int64, the version that sampled each response token (0 where response_mask is 0).
TOKEN_WEIGHT_VERSIONS_KEY = "token_weight_versions"
ROLLOUT_SUBDIR = "rollout"

# Per generation: the rollout pool's samples/s (ranks' rates add up) and each rank's idle
# seconds (no call running) since the previous generation (averaged over ranks).
GEN_SAMPLES_PER_S = "async/gen_samples_per_s"
ROLLOUT_IDLE_S = "async/rollout_idle_s"
# Partial rollouts: samples holding tokens of a newer version than their first (summed).
CONTINUED_SAMPLES = "rollout/continued_samples"
declare_reduction(GEN_SAMPLES_PER_S, SUM)
declare_reduction(CONTINUED_SAMPLES, SUM)


class RolloutWorker(WeightBridgeEnd):
    """The rollout engine alone in its processes; see the module docstring."""

    spec: RolloutWorkerSpec

    def __init__(self, spec: RolloutWorkerSpec) -> None:
        super().__init__(spec)
        self.rollout: BaseRollout | None = None
        self.agent_loop: AgentLoop | HarnessLoop | None = None
        self.weight_version = 0
        # Idle time: the gaps between calls, summed until the next generation reports them.
        self._last_end = time.perf_counter()
        self._idle_s = 0.0

    def _call_started(self) -> float:
        now = time.perf_counter()
        self._idle_s += max(0.0, now - self._last_end)
        return now

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join this pool's own process group, then build the rollout (and agent loop) as the
        policy worker does (the same per-rank seeds)."""
        spec = self.spec
        self.init_process_group(spec.backend)
        self.rollout, self.agent_loop = build_rollout(self, spec)
        log.info("rank %d: rollout ready on pool %s", self.rank, spec.pool)

    def _rollout(self) -> BaseRollout:
        if self.rollout is None:
            msg = "RolloutWorker: call init_model() first"
            raise RuntimeError(msg)
        return self.rollout

    # --- generation -----------------------------------------------------------------------

    @register(dispatch_mode=mesh_dispatch_mode("rollout"))
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """One response per prompt row, each tagged with the weight version it was sampled
        with (``non_tensor_batch["weight_version"]``)."""
        return self._generate(prompts, sampling)

    @register(dispatch_mode=mesh_dispatch_mode("rollout"), blocking=False)
    def generate_sequences_async(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """:meth:`generate_sequences`, returning the driver a future (one-step-off: the next
        batch generates while the trainer trains; a later weight sync queues behind it)."""
        return self._generate(prompts, sampling)

    def _generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        import numpy as np

        rollout = self._rollout()
        start = self._call_started()
        timing: dict[str, list[float]] = {}
        # One call: every token (every turn of an agent loop's conversations) is sampled with
        # this version; a weight sync queues behind the call on this actor.
        with clock(timing, "generate"):
            rollout.wake_up()
            if self.agent_loop is not None:
                # A harness's endpoint records the version answering each call.
                self.agent_loop.weight_version = self.weight_version
                out = self.agent_loop.generate(rollout, prompts, sampling)
            else:
                out = rollout.generate(prompts, sampling)
        out.non_tensor_batch[WEIGHT_VERSION_KEY] = sample_versions(out, self.weight_version)
        self._last_end = time.perf_counter()
        metrics = {**out.meta_info.get("metrics", {}), **summed(timing)}
        metrics["rollout/weight_version"] = [float(self.weight_version)]
        spans = out.batch.get(TOKEN_WEIGHT_VERSIONS_KEY) if out.batch is not None else None
        if spans is not None:  # partial rollouts: samples continued across a weight sync
            first = out.non_tensor_batch[WEIGHT_VERSION_KEY]
            newer = (
                spans > spans.new_tensor(np.asarray(first, dtype=np.int64))[:, None]
            ) & out.batch["response_mask"].bool()
            metrics[CONTINUED_SAMPLES] = [float(newer.any(1).sum())]
        metrics[GEN_SAMPLES_PER_S] = [len(out) / max(self._last_end - start, 1e-9)]
        metrics[ROLLOUT_IDLE_S] = [self._idle_s]
        metrics["perf/peak_rss_gb/rollout"] = [peak_rss_gb()]
        self._idle_s = 0.0
        out.meta_info["metrics"] = metrics
        return out

    # --- weights from the trainer's pool --------------------------------------------------

    def _bridge_rank(self) -> int:
        """Bridge rank ``1 + rank`` (the trainer's rank 0 is bridge rank 0)."""
        return 1 + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, version: int) -> DataProto:
        """Load weight ``version`` from the bridge into the rollout; metrics only."""
        from rlcore.protocol import DataProto

        if self._bridge is None:
            msg = "receive_weights: call open_weight_bridge first"
            raise RuntimeError(msg)
        rollout = self._rollout()
        self._call_started()
        timing: dict[str, list[float]] = {}
        with clock(timing, "weight_receive"):
            rollout.wake_up()
            stream = self._bridge.receive(version)
            if self.spec.rollout_spec.partial_rollouts:  # the tokens it samples carry version
                cast("Any", rollout).update_weights(stream, version=version)
            else:
                rollout.update_weights(stream)
        self.weight_version = version
        self._last_end = time.perf_counter()
        return DataProto(meta_info={"metrics": summed(timing)})

    # --- checkpoints ----------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """This rank's rollout counters (and the weight version) into ``path/rollout``."""
        from rlcore.checkpoint import save_worker_state

        out = Path(path) / ROLLOUT_SUBDIR
        out.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {
            "rollout": {k: int(v) for k, v in self._rollout().state_dict().items()},
            "weight_version": self.weight_version,
        }
        save_worker_state(out, self.rank, state)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> int:
        """Undo :meth:`save_checkpoint`; returns the saved weight version (the weights
        themselves come over the bridge next)."""
        from rlcore.checkpoint import load_worker_state

        state = load_worker_state(Path(path) / ROLLOUT_SUBDIR, self.rank)
        rollout = dict(state["rollout"])
        self._rollout().load_state_dict({k: int(v) for k, v in rollout.items()})
        self.weight_version = int(state["weight_version"])
        return self.weight_version


def sample_versions(out: DataProto, version: int) -> Any:
    """Each row's weight version (``WEIGHT_VERSION_KEY``, int64 array): its oldest token's
    where the rollout recorded per-token versions (partial rollouts), so the one staleness
    rule (``rlcore.trainer.async_queue.min_fresh_version``) bounds every token of a sample;
    else ``version``, the one that sampled the whole call. A row without response tokens
    takes ``version``."""
    import numpy as np
    import torch

    tokens = out.batch.get(TOKEN_WEIGHT_VERSIONS_KEY) if out.batch is not None else None
    if tokens is None:
        return np.full(len(out), version, dtype=np.int64)
    mask = out.batch["response_mask"].bool()
    oldest = torch.where(mask, tokens, torch.full_like(tokens, version)).min(dim=1).values
    return oldest.numpy().astype(np.int64)
