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

**Replicas** (``rlcore scale RUN_DIR rollout=N``, :mod:`rlcore.trainer.elastic`): the
rollout may be several groups, each a :class:`Replica` with its own pool (the first pool's
spec) and its own bridge from the trainer's rank 0. A generation goes to the replica free
first (fewest generations in flight; ties to the oldest replica). With more than one, a sync
goes at once only to the idle replicas; a busy one receives the current weights right before
its next generation, so no sync waits behind another replica's work and every batch is still
sampled with the newest weights at its launch. Draining a replica stops launching on it,
collects what it generates and releases it. A replica lost while others are left is dropped
(the fleet shrinks, no restart spent) and its batches are generated again on the others; the
last one is replaced in place as above. One replica runs exactly as before (the unscaled run
is unchanged, bit for bit).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs

from rlcore.errors import RlcoreError, WorkerError, WorkerLostError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rlcore.dispatch import DispatchInfo, GroupFuture
    from rlcore.interfaces import SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.workers import RayWorkerGroup
    from rlcore.workers.resources import ResourcePool

    # Start added replicas (their numbers): each a started group on a new pool of its own.
    SpawnReplicas = Callable[[list[int]], list[tuple[RayWorkerGroup, ResourcePool]]]

log = logging.getLogger(__name__)

__all__ = ["Replica", "SplitPolicy"]


class RestartBudget(Protocol):
    """What the split policy needs of :class:`rlcore.trainer.recovery.Recovery` (which builds
    the workers, so naming it here would close a circle through the builder)."""

    lost_samples: int

    def spend(self, err: WorkerLostError) -> None: ...


@attrs.define(eq=False)
class Replica:
    """One rollout worker group of the fleet: its pool, the trainer's name for its bridge
    ("": the first replica's), its replacements in place (``epoch``), the weight version it
    holds, the queued generations launched on it and not yet collected."""

    group: RayWorkerGroup
    pool: ResourcePool | None
    bridge: str = ""
    epoch: int = 0
    version: int = 0
    outstanding: list[_Regenerating] = attrs.Factory(list)
    draining: bool = False

    def in_flight(self) -> int:
        """Its generations not finished yet (asked of Ray without waiting)."""
        import ray

        busy = [f for f in self.outstanding if f.result is None]
        refs = [ref for f in busy for ref in f.refs]
        if not refs:
            return 0
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
        left = set(pending)
        return sum(1 for f in busy if any(ref in left for ref in f.refs))


class SplitPolicy:
    """Trainer group + rollout replicas behind the policy group's methods (module docstring).

    ``pool``: the first replica's pool; ``spawn``: starts added replicas (None: the fleet
    cannot grow)."""

    def __init__(
        self,
        trainer: RayWorkerGroup,
        rollout: RayWorkerGroup,
        *,
        pools: str,
        pool: ResourcePool | None = None,
        spawn: SpawnReplicas | None = None,
    ) -> None:
        self.trainer = trainer
        self.replicas = [Replica(rollout, pool)]
        self.pools = pools
        self.spawn = spawn
        self.version = 0
        self.recovery: RestartBudget | None = None  # None: a lost rollout rank stops the run
        self.applied_request: str | None = None  # the last scale request acted on (its id)
        self._numbered = 0  # replicas added so far (their bridges' names)

    @property
    def rollout(self) -> RayWorkerGroup:
        """The first replica's group (the only one unless the run was scaled)."""
        return self.replicas[0].group

    @property
    def epoch(self) -> int:
        return self.replicas[0].epoch

    # --- a lost rollout, replaced in place or dropped --------------------------------------

    def replace_rollout(self, err: WorkerLostError, replica: Replica | None = None) -> None:
        """Kill what is left of a replica's group (the first by default), start it again in
        its bundles, open its bridge and send it the current weights (a restart of
        ``self.recovery``)."""
        from rlcore.workers.restart import restart_group

        rep = self.replicas[0] if replica is None else replica
        if self.recovery is None:
            raise err
        self.recovery.spend(err)  # past trainer.max_worker_restarts: raises err's line
        rep.group = restart_group(rep.group)
        rep.epoch += 1
        rep.group.init_model()
        # The trainer's rank 0 may still be in a send to the dead ranks: the send fails
        # once they are gone, and its next call (the new bridge) runs after it.
        self._open_bridge(rep)

    def _recover(self, err: WorkerLostError, rep: Replica, epoch: int) -> None:
        """After ``err`` in a call made on replica ``rep`` at ``epoch``: drop it when other
        replicas are left, else replace it, unless that happened already; a loss of the
        trainer's side goes on up."""
        if err.role != rep.group.role:
            raise err
        if rep not in self.replicas or epoch != rep.epoch:
            return  # dropped or replaced already
        others = [r for r in self.replicas if r is not rep and not r.draining]
        if not others:
            self.replace_rollout(err, rep)
            return
        log.warning(
            "rollout replica lost for good, the fleet shrinks to %d replica(s) and its "
            "queued batches are generated again on them: %s",
            len(self.replicas) - 1,
            str(err).partition("\n")[0],
        )
        self._release(rep)

    # --- the fleet ------------------------------------------------------------------------

    def scale_to(self, count: int) -> None:
        """Grow the fleet to ``count`` replicas, or drain the newest down to it."""
        live = [r for r in self.replicas if not r.draining]
        if count > len(live):
            self._add(count - len(live))
        elif count < len(live):
            self._drain(live[count:])

    def _add(self, count: int) -> None:
        """Start ``count`` replicas, each with the current weights before it takes work; all
        or none (one that cannot be placed or started leaves the fleet as it was)."""
        if self.spawn is None:
            log.warning("rollout replicas cannot be added to this run")
            return
        numbers = list(range(self._numbered + 1, self._numbered + count + 1))
        self._numbered += count
        added: list[Replica] = []
        try:
            for number, (group, pool) in zip(numbers, self.spawn(numbers), strict=True):
                added.append(Replica(group, pool, bridge=f"replica{number}"))
            for rep in added:
                rep.group.init_model()
                self._open_bridge(rep)
        except RlcoreError as err:
            for rep in added:
                self._release(rep)
            log.warning(
                "rlcore scale: %d more rollout replica(s) could not be started, the fleet "
                "stays at %d: %s",
                count,
                len(self.replicas),
                str(err).partition("\n")[0],
            )
            return
        self.replicas += added
        log.info("rollout replicas: %d (added %d)", len(self.replicas), count)

    def _drain(self, reps: list[Replica]) -> None:
        """Stop launching on ``reps``, collect what they generate, release them."""
        for rep in reps:
            rep.draining = True
        for rep in reps:
            for fut in list(rep.outstanding):
                fut.get()  # kept for its step (generated again elsewhere if it is lost)
            self._release(rep)
        log.info("rollout replicas: %d (drained %d)", len(self.replicas), len(reps))

    def _release(self, rep: Replica) -> None:
        """Kill a replica's processes, give its pool back and close its bridge."""
        if rep in self.replicas:
            self.replicas.remove(rep)
        rep.group.shutdown()
        if rep.pool is not None:
            rep.pool.remove()
        if rep.bridge:  # not waited for: the trainer may still be in a send that fails
            self.trainer.close_weight_bridge(rep.bridge)

    def shutdown(self) -> None:
        """Release every replica (the end of the run's workers)."""
        for rep in list(self.replicas):
            rep.group.shutdown()
            if rep.pool is not None:
                rep.pool.remove()

    def _pick(self) -> Replica:
        """The replica free first: fewest generations in flight, the oldest on a tie."""
        live = [r for r in self.replicas if not r.draining]
        if len(live) == 1:
            return live[0]
        return min(live, key=lambda r: r.in_flight())

    # --- the bridge -----------------------------------------------------------------------

    def open_bridge(self) -> None:
        """Open the first replica's bridge and send it the current weights (at placement)."""
        self._open_bridge(self.replicas[0])

    def _open_bridge(self, rep: Replica) -> None:
        """Agree on the manifest, join trainer rank 0 and every rank of ``rep``, sync the
        current version."""
        manifest = self.trainer.weight_manifest()[0]
        addr, port = self.trainer.bridge_address()[0]
        world = 1 + rep.group.world_size
        futures = [
            self.trainer.open_weight_bridge(addr, port, world, manifest, self.pools, rep.bridge),
            rep.group.open_weight_bridge(addr, port, world, manifest, self.pools),
        ]
        self._wait_watching_both(rep, *futures)
        for fut in futures:
            fut.get()
        log.info(
            "weight bridge %s:%d open between pools %s: %d tensors, %d rollout rank(s)",
            addr,
            port,
            self.pools,
            len(manifest),
            rep.group.world_size,
        )
        self._sync(rep, self.version)

    def sync_weights(self, version: int) -> dict[str, list[float]]:
        """Send the trainer's weights to the rollout replicas as ``version``; its metrics.
        With several replicas a busy one is sent them before its next generation."""
        metrics: dict[str, list[float]] = {}
        several = len(self.replicas) > 1
        for rep in list(self.replicas):
            if rep.draining or (several and rep.in_flight()):
                continue
            epoch = rep.epoch
            try:
                out = self._sync(rep, version)
            except WorkerLostError as err:
                self._recover(err, rep, epoch)  # a new group received the current version
                if rep not in self.replicas:
                    continue
                out = self._sync(rep, version)
            for key, values in out.items():
                metrics.setdefault(key, []).extend(values)
        self.version = version
        return metrics

    def _current(self, rep: Replica) -> None:
        """Send ``rep`` the current weights if a sync passed it by while it was busy."""
        if rep.version != self.version:
            self._sync(rep, self.version)

    def _sync(self, rep: Replica, version: int) -> dict[str, list[float]]:
        start = time.perf_counter()
        sent = self.trainer.send_weights(version, rep.bridge)
        received = rep.group.receive_weights(version)
        self._wait_watching_both(rep, sent, received)
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
        self.version = rep.version = version
        metrics["weight_sync/version"] = [float(version)]
        metrics["timing_s/weight_sync"] = [time.perf_counter() - start]
        return metrics

    def _wait_watching_both(self, rep: Replica, sent: GroupFuture, received: GroupFuture) -> None:
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

        sides = ((self.trainer, sent, "send_weights"), (rep.group, received, "receive_weights"))
        refs = [*sent.refs, *received.refs]
        deadline = time.monotonic() + max(self.trainer.call_timeout_s, rep.group.call_timeout_s)
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
        """Generate ``prompts`` on the replica free first; again on the others, or on a
        replaced group, when a rank was lost."""
        while True:  # bounded: each replacement spends a restart, each drop shrinks the fleet
            rep = self._pick()
            epoch = rep.epoch
            try:
                self._current(rep)
                out: DataProto = rep.group.generate_sequences(prompts, sampling)
            except WorkerLostError as err:
                self._recover(err, rep, epoch)
                continue
            return out

    def generate_async(self, prompts: DataProto, sampling: SamplingParams) -> GroupFuture:
        """Start generating ``prompts`` now on the replica free first (with the current
        weights); a future whose ``get()`` generates them again, on the other replicas or a
        replaced group, when a rank was lost."""
        while True:
            rep = self._pick()
            epoch = rep.epoch
            try:
                self._current(rep)
            except WorkerLostError as err:
                self._recover(err, rep, epoch)
                continue
            fut = rep.group.generate_sequences_async(prompts, sampling)
            queued = _Regenerating(self, prompts, sampling, fut, rep, epoch)
            rep.outstanding.append(queued)
            return cast("GroupFuture", queued)

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
        """The trainer's state and the first replica's (the one a resumed run starts with),
        every replica holding the current weights first."""
        for rep in self.replicas:
            if not rep.draining:
                self._current(rep)
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
    """A queued generation (:meth:`SplitPolicy.generate_async`) that survives its replica:
    when the replica lost a rank, ``get()`` generates the same prompts again on the others or
    on its replaced group (with the current weights, so its rows carry the current version).
    The result is kept: a drained replica's batch is collected before its step takes it."""

    def __init__(
        self,
        policy: SplitPolicy,
        prompts: DataProto,
        sampling: SamplingParams,
        future: GroupFuture,
        replica: Replica,
        epoch: int,
    ) -> None:
        self.policy, self.prompts, self.sampling = policy, prompts, sampling
        self.future, self.replica, self.epoch = future, replica, epoch
        self.result: DataProto | None = None

    @property
    def refs(self) -> list[Any]:
        return list(self.future.refs)

    def get(self) -> DataProto:
        if self.result is not None:
            return self.result
        try:
            out: DataProto = self.future.get()
        except WorkerLostError as err:
            self.policy._recover(err, self.replica, self.epoch)
            out = self.policy.generate_sequences(self.prompts, self.sampling)
            expected = len(self.prompts)
            if self.policy.recovery is not None and len(out) < expected:
                self.policy.recovery.lost_samples += expected - len(out)
            log.warning("regenerated %d queued prompt rows on a live rollout group", expected)
        finally:
            if self in self.replica.outstanding:
                self.replica.outstanding.remove(self)
        self.result = out
        return out


def _failed(ref: Any) -> bool:
    """Whether a finished call raised (its ``get()`` then reports it, naming the rank)."""
    import ray

    try:
        ray.get(ref, timeout=0)
    except Exception:
        return True
    return False
