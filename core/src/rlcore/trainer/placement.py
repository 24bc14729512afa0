"""The driver's view of a policy whose rollout runs on a pool of its own.

:class:`SplitPolicy` stands where the policy worker group stands in a colocated run (the
step program, validation, checkpoints and the export call the same methods): generation
goes to the rollout group, forward passes, updates, checkpoints and the export to the
trainer group. After every ``update_actor`` it moves the new weights across the pools over
the weight bridge (:mod:`rlcore.workers.weight_bridge`) and bumps the weight version, so the
next generation samples the policy just trained (on-policy, as colocated).

Metrics of a sync (merged into the update's): ``weight_sync/version``, ``weight_sync/bytes``,
``weight_sync/buckets``, ``timing_s/worker/weight_send`` (trainer rank 0 streaming) and
``timing_s/weight_sync`` (the driver's wall clock of the whole sync).

A rollout rank lost in a generation or a sync (a :class:`~rlcore.errors.WorkerLostError`:
it died or stopped responding) is replaced in place when the run has restarts left
(:meth:`SplitPolicy.replace_rollout`, :mod:`rlcore.trainer.recovery`): the generation is
made again on the new group with the current weights, the sync sent again.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

from rlcore.errors import WorkerError, WorkerLostError

if TYPE_CHECKING:
    from rlcore.dispatch import DispatchInfo, GroupFuture
    from rlcore.interfaces import SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.workers import RayWorkerGroup

log = logging.getLogger(__name__)

__all__ = ["SplitPolicy"]


class RestartBudget(Protocol):
    """What the split policy needs of :class:`rlcore.trainer.recovery.Recovery` (which builds
    the workers, so naming it here would close a circle through the builder)."""

    lost_samples: int

    def spend(self, err: WorkerLostError) -> None: ...


class SplitPolicy:
    """Trainer group + rollout group behind the policy group's methods (module docstring)."""

    def __init__(self, trainer: RayWorkerGroup, rollout: RayWorkerGroup, *, pools: str) -> None:
        self.trainer = trainer
        self.rollout = rollout
        self.pools = pools
        self.version = 0
        self.recovery: RestartBudget | None = None  # None: a lost rollout rank stops the run
        self.epoch = 0  # replacements of the rollout group so far

    # --- a lost rollout, replaced in place -------------------------------------------------

    def replace_rollout(self, err: WorkerLostError) -> None:
        """Kill what is left of the rollout group, start it again in its bundles, open the
        bridge to it and send it the current weights (a restart of ``self.recovery``)."""
        from rlcore.workers.restart import restart_group

        if self.recovery is None:
            raise err
        self.recovery.spend(err)  # past trainer.max_worker_restarts: raises err's line
        self.rollout = restart_group(self.rollout)
        self.epoch += 1
        self.rollout.init_model()
        # The trainer's rank 0 may still be in a send to the dead ranks: the send fails
        # once they are gone, and its next call (the new bridge) runs after it.
        self.open_bridge()

    def _recover(self, err: WorkerLostError, epoch: int) -> None:
        """After ``err`` in a call made on the rollout group of ``epoch``: replace that group
        unless it was replaced already; a loss of the trainer's side goes on up."""
        if err.role != self.rollout.role:
            raise err
        if epoch == self.epoch:
            self.replace_rollout(err)

    # --- the bridge -----------------------------------------------------------------------

    def open_bridge(self) -> None:
        """Agree on the manifest, join trainer rank 0 and every rollout rank, sync version 0."""
        manifest = self.trainer.weight_manifest()[0]
        addr, port = self.trainer.bridge_address()[0]
        world = 1 + self.rollout.world_size
        futures = [
            self.trainer.open_weight_bridge(addr, port, world, manifest, self.pools),
            self.rollout.open_weight_bridge(addr, port, world, manifest, self.pools),
        ]
        self._wait_watching_both(*futures)
        for fut in futures:
            fut.get()
        log.info(
            "weight bridge %s:%d open between pools %s: %d tensors, %d rollout rank(s)",
            addr,
            port,
            self.pools,
            len(manifest),
            self.rollout.world_size,
        )
        self._sync(self.version)

    def sync_weights(self, version: int) -> dict[str, list[float]]:
        """Send the trainer's weights to every rollout rank as ``version``; its metrics."""
        epoch = self.epoch
        try:
            return self._sync(version)
        except WorkerLostError as err:
            self._recover(err, epoch)  # the new group received the current version
            return self._sync(version)

    def _sync(self, version: int) -> dict[str, list[float]]:
        start = time.perf_counter()
        sent = self.trainer.send_weights(version)
        received = self.rollout.receive_weights(version)
        self._wait_watching_both(sent, received)
        try:
            outs = list(sent.get())
        except WorkerError as err:
            # A rollout rank that died shows first as the trainer's broadcast failing
            # ("Connection closed by peer"): name the rollout's pool and rank instead.
            raise self._dead_rollout(received) or err from err
        outs += received.get()
        metrics: dict[str, list[float]] = {}
        for out in outs:
            for key, values in (out.meta_info.get("metrics") or {}).items():
                listed = [values] if isinstance(values, int | float) else list(values)
                metrics.setdefault(key, []).extend(float(v) for v in listed)
        self.version = version
        metrics["weight_sync/version"] = [float(version)]
        metrics["timing_s/weight_sync"] = [time.perf_counter() - start]
        return metrics

    def _wait_watching_both(self, sent: GroupFuture, received: GroupFuture) -> None:
        """Wait until both sides of a sync finished (or one failed), watching the heartbeats
        of both groups.

        The trainer's rank 0 blocked in the broadcast keeps beating while a stopped rollout
        rank never takes its part, so waiting on the trainer's call alone would only end at
        the collective timeout; a stopped rank of either side is named here within
        ``resources.heartbeat_timeout_s`` (rlcore.workers.liveness). Bounded by the groups'
        call timeout; the ``get()`` calls that follow report results, deaths and timeouts.
        """
        import ray

        from rlcore.workers import liveness

        sides = ((self.trainer, sent, "send_weights"), (self.rollout, received, "receive_weights"))
        refs = [*sent.refs, *received.refs]
        deadline = time.monotonic() + max(self.trainer.call_timeout_s, self.rollout.call_timeout_s)
        succeeded: set[Any] = set()  # finished without error: not fetched again each poll
        while time.monotonic() < deadline:
            ready, pending = ray.wait(refs, num_returns=len(refs), timeout=liveness.POLL_S)
            fresh = [ref for ref in ready if ref not in succeeded]
            if not pending or any(_failed(ref) for ref in fresh):
                return
            succeeded.update(fresh)
            for group, future, method in sides:
                left = [rank for rank, ref in enumerate(future.refs) if ref in pending]
                group.check_heartbeats(left, method)

    def _dead_rollout(self, received: GroupFuture) -> WorkerError | None:
        """The rollout group's error when one of its ranks died (looked for briefly)."""
        import ray
        from ray.exceptions import RayActorError

        ready, _ = ray.wait(received.refs, num_returns=len(received.refs), timeout=5.0)
        for rank, ref in enumerate(received.refs):
            if ref not in ready:
                continue
            try:
                ray.get(ref, timeout=0)  # in `ready`: returns at once, re-raising its error
            except RayActorError:
                try:
                    received.get()  # raises the group's one-line error, naming the rank
                except WorkerError as dead:
                    return dead
            except Exception:  # a live rank's failure: the trainer's error stands
                log.debug("rollout rank %d failed in receive_weights", rank)
        return None

    # --- what the driver calls ------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.trainer.world_size

    def dispatch_info(self, mesh: str) -> list[DispatchInfo]:
        return self.trainer.dispatch_info(mesh)

    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """Generate ``prompts``; again on a replaced rollout group when a rank was lost."""
        while True:  # bounded: each replacement spends a restart
            epoch = self.epoch
            try:
                out: DataProto = self.rollout.generate_sequences(prompts, sampling)
            except WorkerLostError as err:
                self._recover(err, epoch)
                continue
            return out

    def generate_async(self, prompts: DataProto, sampling: SamplingParams) -> GroupFuture:
        """Start generating ``prompts`` now (with the rollout's current weights); a future
        whose ``get()`` generates them again, on a replaced group, when a rank was lost."""
        fut = self.rollout.generate_sequences_async(prompts, sampling)
        return cast("GroupFuture", _Regenerating(self, prompts, sampling, fut, self.epoch))

    def compute_log_prob(self, data: DataProto) -> DataProto:
        out: DataProto = self.trainer.compute_log_prob(data)
        return out

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        out: DataProto = self.trainer.compute_ref_log_prob(data)
        return out

    def update_actor(self, data: DataProto, step: int) -> DataProto:
        """The trainer's update, then the new weights to the rollout as the next version."""
        out: DataProto = self.trainer.update_actor(data, step)
        metrics = dict(out.meta_info.get("metrics") or {})
        metrics.update(self.sync_weights(self.version + 1))
        out.meta_info["metrics"] = metrics
        return out

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)
        self.rollout.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        """Both groups' state, then the restored weights to the rollout at the saved version."""
        self.trainer.load_checkpoint(path)
        versions = self.rollout.load_checkpoint(path)
        self.sync_weights(max(int(v) for v in versions))

    def export_hf(self, path: str) -> Any:
        return self.trainer.export_hf(path)


class _Regenerating:
    """A queued generation (:meth:`SplitPolicy.generate_async`) that survives its rollout
    group: when the group lost a rank, ``get()`` generates the same prompts again on the new
    group (with the current weights, so its rows carry the current version)."""

    def __init__(
        self,
        policy: SplitPolicy,
        prompts: DataProto,
        sampling: SamplingParams,
        future: GroupFuture,
        epoch: int,
    ) -> None:
        self.policy, self.prompts, self.sampling = policy, prompts, sampling
        self.future, self.epoch = future, epoch

    @property
    def refs(self) -> list[Any]:
        return list(self.future.refs)

    def get(self) -> DataProto:
        try:
            out: DataProto = self.future.get()
        except WorkerLostError as err:
            self.policy._recover(err, self.epoch)
            out = self.policy.generate_sequences(self.prompts, self.sampling)
            expected = len(self.prompts)
            if self.policy.recovery is not None and len(out) < expected:
                self.policy.recovery.lost_samples += expected - len(out)
            log.warning("regenerated %d queued prompt rows on the new rollout group", expected)
        return out


def _failed(ref: Any) -> bool:
    """Whether a finished call raised (its ``get()`` then reports it, naming the rank)."""
    import ray

    try:
        ray.get(ref, timeout=0)
    except Exception:
        return True
    return False
