"""The policy role worker the driver calls: actor + rollout + reference in one process.

``ActorRolloutRefWorker`` holds, in one process per device, the actor's training engine, the
rollout (generation) engine and, when the algorithm needs KL, the frozen reference engine.
After every actor update the new weights reach the rollout in the same process
(:func:`rlcore.workers.weight_push.push_weights`: shared storage where the engine and rollout
allow it, else ``rollout.update_weights(engine.named_parameters_for_sync())``), so nothing
crosses Ray.
The critic is its own worker (:mod:`rlcore.roles.critic`). When the rollout has a pool of its own
(``PolicySpec.rollout_pool``), the policy worker holds no rollout and its weights leave over
the weight bridge instead (``weight_manifest``, ``open_weight_bridge``, ``send_weights``;
:mod:`rlcore.roles.rollout_worker`, docs/placement.md).

Each worker gets its role's spec (:mod:`rlcore.trainer.specs`), built on the driver, never the
run config; engines, rollout and algorithm are built from their
:class:`~rlcore.plugins.Component` inside the worker: the worker never branches on a plugin
name. Both classes stay undecorated (the worker group applies ``ray.remote``) and importable
from this module, as Ray needs for classes touching torch.distributed.

Around training the policy worker drives the rollout's memory: ``wake_up_weights()`` before
weight sync, ``wake_up()`` (the KV cache) once the actor is offloaded, ``sleep()`` after
generation; the actor engine is ``offload()``-ed while the rollout generates and
``onload()``-ed after; the reference is onloaded only for its own forward pass.

Every engine declares its data-parallel place in a mesh of its own (``actor``, ``ref``,
``critic``; :meth:`BaseEngine.dispatch_info`, default: purely data-parallel), and the methods
that feed it rows use that mesh's dispatch (:func:`rlcore.dispatch.mesh_dispatch_mode`): with
tensor or pipeline parallelism the ranks of one data-parallel group get the same rows and one
rank's output is kept; purely data-parallel engines get one shard per rank, as with
``DP_COMPUTE_PROTO``. Generation stays ``DP_COMPUTE_PROTO``: every rank's rollout holds the
whole model. The driver reads each mesh's ``dp_size`` to lay out the update rows.

Each method returns its data and, in ``meta_info["metrics"]``, lists of metric values;
``DataProto.concat`` merges them over ranks and the driver reduces them. Worker-side phase
times go under ``timing_s/worker/*`` so ``benchmarks/step.py`` can tell compute from overhead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.interfaces import BaseAlgorithm, BaseEngine, BaseRollout, SamplingParams
from rlcore.roles.mesh import ACTOR_MESH, REF_MESH, ROLLOUT_MESH, declare_mesh
from rlcore.roles.update import RoleTrainer, clock, summed
from rlcore.tracking.metrics import peak_rss_gb
from rlcore.workers import RoleWorker, Worker
from rlcore.workers.weight_push import push_weights

if TYPE_CHECKING:
    import torch

    from rlcore.agent.harness import HarnessLoop
    from rlcore.agent.loop import AgentLoop
    from rlcore.protocol import DataProto
    from rlcore.roles.specs import AgentSpec, PolicySpec, RolloutWorkerSpec
    from rlcore.workers.weight_bridge import TensorMeta, WeightBridge

log = logging.getLogger(__name__)

__all__ = [
    "POLICY_INPUT_KEYS",
    "ActorRolloutRefWorker",
    "WeightBridgeEnd",
    "build_rollout",
    "push_weights",
]

# What a forward pass over (prompt, response) needs; the driver sends only these (plus the
# loss inputs) so per-row strings and dicts do not cross Ray.
POLICY_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")

# Same name as rlcore.checkpoint.ACTOR_DIR (the checkpoint layout contract).
ACTOR_SUBDIR = "actor"

_ACTOR = mesh_dispatch_mode(ACTOR_MESH)
_REF = mesh_dispatch_mode(REF_MESH)


def build_rollout(
    worker: Worker, spec: PolicySpec | RolloutWorkerSpec
) -> tuple[BaseRollout, AgentLoop | HarnessLoop | None]:
    """The rollout of ``spec`` for ``worker``'s rank, and the agent loop with ``[agent]``.

    Ranks draw different samples (seed + 1000 x rank); reruns reproduce. A rollout spanning
    several workers says where this rank sits (``dispatch_info()``); otherwise every worker
    is its own shard.
    """
    import attrs

    rollout_spec = attrs.evolve(spec.rollout_spec, seed=spec.rollout_spec.seed + 1000 * worker.rank)
    rollout = spec.rollout.build(rollout_spec)
    declare_mesh(worker, rollout, ROLLOUT_MESH)
    agent_loop = None if spec.agent is None else _build_agent_loop(spec.agent)
    return rollout, agent_loop


def _build_agent_loop(spec: AgentSpec) -> AgentLoop | HarnessLoop:
    """The agent loop of ``[agent]``: the policy's tokenizer and the selected tools, or the
    harness loop (``[agent] harness``: agent code behind this replica's OpenAI endpoint)."""
    from transformers import AutoTokenizer

    from rlcore.agent.loop import AgentLoop

    tokenizer = AutoTokenizer.from_pretrained(
        spec.tokenizer_path, trust_remote_code=spec.trust_remote_code
    )
    if spec.harness is not None:
        from rlcore.agent.harness import HarnessLoop

        return HarnessLoop(tokenizer, spec.harness, spec.config, spec.environment)
    tools = [tool.build() for tool in spec.tools]
    env = spec.environment
    if env is None:
        return AgentLoop(tokenizer, tools, spec.config)
    from rlcore.agent.harness import GuardedEnvironment

    env_cls = env.resolve()
    return AgentLoop(
        tokenizer, tools, spec.config,
        environment=lambda: GuardedEnvironment(env_cls(env.options), env.name),
    )  # fmt: skip


class WeightBridgeEnd(RoleWorker):
    """A worker at one end of the weight bridge (:mod:`rlcore.workers.weight_bridge`): the
    policy worker sends from its rank 0 (bridge rank 0), each rank of the rollout's own pool
    receives (bridge ranks 1..R). Its ``spec`` carries ``backend`` and
    ``weight_sync_bucket_bytes``."""

    spec: PolicySpec | RolloutWorkerSpec

    def __init__(self, spec: PolicySpec | RolloutWorkerSpec) -> None:
        super().__init__(spec)
        self._bridge: WeightBridge | None = None
        # The trainer's bridges to the rollout replicas added by ``rlcore scale`` (by name;
        # the first replica's is ``_bridge``): each replica is a group with a bridge of its own.
        self._bridges: dict[str, WeightBridge] = {}

    def _bridge_rank(self) -> int | None:
        """This rank's place in the bridge; None: it stays out."""
        raise NotImplementedError

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def open_weight_bridge(
        self,
        addr: str,
        port: int,
        world_size: int,
        manifest: list[TensorMeta],
        pools: str,
        name: str = "",
    ) -> None:
        """Join the bridge as :meth:`_bridge_rank` (a rank that stays out returns).
        ``name``: an added rollout replica's bridge ("": the first replica's)."""
        from rlcore.workers.weight_bridge import WeightBridge

        rank = self._bridge_rank()
        if rank is None:
            return
        bridge = WeightBridge(
            addr=addr,
            port=port,
            rank=rank,
            world_size=world_size,
            backend=self.spec.backend,
            timeout_s=self._collective_timeout_s,
            pools=pools,
            manifest=manifest,
            bucket_bytes=self.spec.weight_sync_bucket_bytes,
        )
        if name:
            self._bridges[name] = bridge
        else:
            self._bridge = bridge

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def close_weight_bridge(self, name: str) -> None:
        """Forget an added replica's bridge (its group was released or lost)."""
        self._bridges.pop(name, None)


class ActorRolloutRefWorker(WeightBridgeEnd):
    """Actor engine + rollout (+ reference engine) in one process; see the module docstring.

    ``spec``: the policy role's :class:`~rlcore.roles.specs.PolicySpec`, built on the driver.
    """

    spec: PolicySpec

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.actor: BaseEngine | None = None
        self.rollout: BaseRollout | None = None
        self.ref: BaseEngine | None = None
        self.algorithm: BaseAlgorithm | None = None
        self._trainer: RoleTrainer | None = None
        self._ref_in_actor = False
        self.agent_loop: AgentLoop | HarnessLoop | None = None

    # --- construction ---------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join torch.distributed, build actor (+ ref) engines, algorithm, then the rollout.

        The rollout is built last so an inference engine sizes its cache from what is free,
        then loaded with the actor's weights once.
        """
        import attrs

        spec = self.spec
        self.init_process_group(spec.backend)
        self.algorithm = spec.algorithm.build()
        self.actor = spec.actor.engine.build(spec.actor.spec)
        actor_mesh = declare_mesh(self, self.actor, ACTOR_MESH)
        self._trainer = RoleTrainer(
            "actor",
            self.actor,
            spec.update,
            skip_zero_advantage_rows=spec.skip_zero_advantage_rows,
            backend=spec.backend,
            replicas=self.world_size // actor_mesh.dp_size,
        )
        # A LoRA actor is its own reference (adapters off) unless [ref.engine] differs.
        self._ref_in_actor = (
            spec.ref is not None
            and self.actor.ref_in_actor
            and (spec.ref.engine.name, spec.ref.engine.options)
            == (spec.actor.engine.name, spec.actor.engine.options)
        )
        if spec.ref is not None and not self._ref_in_actor:
            self.ref = spec.ref.engine.build(spec.ref.spec)
        if self.ref is not None:
            declare_mesh(self, self.ref, REF_MESH)
        elif self._ref_in_actor:
            self.set_dispatch_info(**attrs.asdict(actor_mesh), mesh=REF_MESH)
        ref = " + ref" if self.ref else " (ref: adapters off)" if self._ref_in_actor else ""
        if spec.rollout_pool is not None:  # the rollout is a worker group of its own
            log.info("rank %d: actor%s ready (rollout on %s)", self.rank, ref, spec.rollout_pool)
            return
        # The rollout is built with the actor (and reference) off the device: an inference
        # engine checks and sizes its memory against what is free when it starts.
        self.actor.offload()
        if self.ref is not None:
            self.ref.offload()
        self.rollout, self.agent_loop = build_rollout(self, spec)
        self._sync_weights()
        log.info("rank %d: actor%s and rollout ready", self.rank, ref)

    def _sync_weights(self) -> int:
        """Wake the rollout, stream the actor's weights into it, then offload the actor; the
        bytes sent (:func:`push_weights`).

        Nothing here when the rollout has a pool of its own: the driver then sends the
        weights over the bridge (:meth:`send_weights`) after the update returns.
        """
        if self.spec.rollout_pool is not None:
            return 0
        actor, rollout, _, _ = self._parts()
        # verl's order: the rollout's weights back, the actor's in, the actor off the device,
        # then the rollout's KV cache: the KV cache and the actor are never resident together.
        rollout.wake_up_weights()
        actor.onload()
        sent = push_weights(actor, rollout)
        actor.offload()  # the rollout generates next
        rollout.wake_up()
        return sent

    def _parts(self) -> tuple[BaseEngine, BaseRollout, BaseAlgorithm, RoleTrainer]:
        actor, algorithm, trainer = self._trainer_parts()
        if self.rollout is None:
            where = self.spec.rollout_pool
            msg = (
                f"ActorRolloutRefWorker: the rollout runs on pool {where!r}, not in this process"
                if where is not None
                else "ActorRolloutRefWorker: call init_model() first"
            )
            raise RuntimeError(msg)
        return actor, self.rollout, algorithm, trainer

    def _trainer_parts(self) -> tuple[BaseEngine, BaseAlgorithm, RoleTrainer]:
        if self.actor is None or self.algorithm is None or self._trainer is None:
            msg = "ActorRolloutRefWorker: call init_model() first"
            raise RuntimeError(msg)
        return self.actor, self.algorithm, self._trainer

    # --- checkpoints ----------------------------------------------------------------------

    def _checkpoint_states(self) -> dict[str, Any]:
        """This role's checkpoint map besides the engine's own files (one place, both ways).

        The reference engine is frozen at ``model.path``: nothing to save. The process RNG is
        saved here once (the critic, colocated in this process, does not save it again).
        """
        from rlcore.checkpoint import capture_rng_state

        _, _, trainer = self._trainer_parts()
        states: dict[str, Any] = {
            "rng": capture_rng_state(),
            "actor_optimizer_steps": trainer.steps,
        }
        if self.rollout is not None:  # a rollout of its own pool saves its own state
            states["rollout"] = {k: int(v) for k, v in self.rollout.state_dict().items()}
        return states

    def _restore_states(self, states: dict[str, Any]) -> None:
        from rlcore.checkpoint import restore_rng_state

        _, _, trainer = self._trainer_parts()
        restore_rng_state(states["rng"])
        trainer.steps = int(states["actor_optimizer_steps"])
        if self.rollout is not None:
            self.rollout.load_state_dict({k: int(v) for k, v in dict(states["rollout"]).items()})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Actor engine state and this rank's state map into ``path/actor`` (every rank)."""
        from rlcore.checkpoint import save_worker_state

        actor, _, _ = self._trainer_parts()
        out = Path(path) / ACTOR_SUBDIR
        actor.save_checkpoint(str(out))
        save_worker_state(out, self.rank, self._checkpoint_states())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Undo :meth:`save_checkpoint`, then copy the restored weights into the rollout."""
        from rlcore.checkpoint import load_worker_state

        actor, _, _ = self._trainer_parts()
        src = Path(path) / ACTOR_SUBDIR
        actor.load_checkpoint(str(src))
        self._restore_states(load_worker_state(src, self.rank))
        self._sync_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> str | None:
        """The actor as a Hugging Face model folder (rank 0 writes; collective).

        Returns None, or the engine's one-line reason when it cannot export (the driver turns
        it into an error naming ``trainer.export_final``), instead of a remote traceback.
        """
        actor, _, _ = self._trainer_parts()
        try:
            actor.export_hf(path)
        except NotImplementedError as err:
            return str(err) or f"{type(actor).__name__} does not implement export_hf"
        return None

    # --- generation -----------------------------------------------------------------------

    @register(dispatch_mode=mesh_dispatch_mode(ROLLOUT_MESH))
    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """One response per prompt row (the driver repeated each prompt ``n`` times)."""
        actor, rollout, _, _ = self._parts()
        timing: dict[str, list[float]] = {}
        with clock(timing, "generate"):
            rollout.wake_up()
            if self.agent_loop is not None:  # multi-turn with tools ([agent])
                out = self.agent_loop.generate(rollout, prompts, sampling)
            else:
                out = rollout.generate(prompts, sampling)
            rollout.sleep()  # free inference memory for training (no-op on CPU)
            actor.onload()
        out.meta_info["metrics"] = {**out.meta_info.get("metrics", {}), **summed(timing)}
        return out

    # --- forward passes -------------------------------------------------------------------

    @register(dispatch_mode=_ACTOR)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) of the responses under the current actor."""
        from rlcore.protocol import DataProto

        actor, _, _ = self._trainer_parts()
        timing: dict[str, list[float]] = {}
        with clock(timing, "actor_forward"):
            outputs = actor.compute_log_prob(data, temperature=self.spec.temperature)
        return DataProto.from_dict(
            tensors={"old_log_probs": _required(outputs.log_probs, "log_probs")},
            meta_info={"metrics": summed(timing)},
        )

    @register(dispatch_mode=_REF)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) under the frozen reference policy."""
        from rlcore.protocol import DataProto

        timing: dict[str, list[float]] = {}
        if self._ref_in_actor:
            actor, _, _ = self._trainer_parts()
            with clock(timing, "ref_forward"):
                outputs = actor.compute_ref_log_prob(data, temperature=self.spec.temperature)
        elif self.ref is None:
            msg = "compute_ref_log_prob: this worker was built without a reference engine"
            raise RuntimeError(msg)
        else:
            with clock(timing, "ref_forward"):
                self.ref.onload()  # offloaded since the rollout was built (no-op otherwise)
                outputs = self.ref.compute_log_prob(data, temperature=self.spec.temperature)
                self.ref.offload()
        return DataProto.from_dict(
            tensors={"ref_log_prob": _required(outputs.log_probs, "log_probs")},
            meta_info={"metrics": summed(timing)},
        )

    # --- update ---------------------------------------------------------------------------

    @register(dispatch_mode=_ACTOR)
    def update_actor(self, data: DataProto, step: int) -> DataProto:
        """``epochs`` passes over this rank's mini-batches, then weight sync; metrics only.

        ``step``: completed training steps so far (seeds the mini-batch shuffle). ``data`` is
        laid out by the driver (:func:`rlcore.trainer.layout.mini_batch_layout`).
        """
        from rlcore.protocol import DataProto

        _, algorithm, trainer = self._trainer_parts()
        metrics: dict[str, list[float]] = {}
        timing: dict[str, list[float]] = {}
        trainer.run(
            algorithm.policy_loss,
            data,
            step=step,
            temperature=self.spec.temperature,
            with_entropy=self.spec.with_entropy,
            metrics=metrics,
            timing=timing,
        )
        with clock(timing, "weight_sync"):
            sent = self._sync_weights()
        if self.spec.rollout_pool is None:
            # 0 when the rollout shares the actor's tensors, the adapter alone, or each tensor
            # once (rlcore.workers.weight_push): the bytes one rank's sync moved
            metrics["perf/weight_sync_bytes"] = [float(sent)]
        metrics["perf/peak_rss_gb/actor"] = [peak_rss_gb()]  # the rollout's and ref's too
        return DataProto(meta_info={"metrics": {**metrics, **summed(timing)}})

    # --- weights to a rollout on its own pool (rlcore.workers.weight_bridge) ----------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_manifest(self) -> list[TensorMeta]:
        """Name, shape and dtype of every tensor a sync streams (collective: every rank)."""
        from rlcore.workers.weight_bridge import manifest_of

        actor, _, _ = self._trainer_parts()
        return manifest_of(actor.named_parameters_for_sync())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bridge_address(self) -> tuple[str, int]:
        """Where bridge rank 0 (this group's rank 0) will serve the rendezvous store."""
        from rlcore.workers.worker import find_free_port, node_ip_address

        return (self.master_addr if self.rank == 0 else node_ip_address()), find_free_port()

    def _bridge_rank(self) -> int | None:
        """Rank 0 joins the bridge as its rank 0 (the other ranks only gather, see send)."""
        return 0 if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, version: int, name: str = "") -> DataProto:
        """Stream the actor's weights as ``version`` (every rank gathers; rank 0 sends) over
        bridge ``name`` (:meth:`open_weight_bridge`)."""
        from rlcore.protocol import DataProto

        actor, _, _ = self._trainer_parts()
        named = actor.named_parameters_for_sync()
        bridge = self._bridges.get(name) if name else self._bridge
        if self.rank != 0:
            for _ in named:  # gathering full tensors is collective
                pass
            return DataProto(meta_info={"metrics": {}})
        if bridge is None:
            msg = "send_weights: call open_weight_bridge first"
            raise RuntimeError(msg)
        metrics = bridge.send(named, version)
        return DataProto(meta_info={"metrics": {k: [v] for k, v in metrics.items()}})


def _required(tensor: torch.Tensor | None, what: str) -> torch.Tensor:
    if tensor is None:
        msg = f"the engine's compute_log_prob returned no {what}"
        raise RuntimeError(msg)
    return tensor
