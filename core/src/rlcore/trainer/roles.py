"""The generic role workers the driver calls: policy (actor + rollout + reference) and critic.

``ActorRolloutRefWorker`` holds, in one process per device, the actor's training engine, the
rollout (generation) engine and, when the algorithm needs KL, the frozen reference engine.
After every actor update the new weights are copied into the rollout in the same process
(``rollout.update_weights(engine.named_parameters_for_sync())``), so nothing crosses Ray.
``CriticWorker`` holds the value model (PPO).

Engines, rollout and algorithm are resolved by name through the plugin registry *inside* the
worker and built from the plugin's ``Config`` carried in the run config: the worker never
branches on a plugin name. Both classes stay undecorated (the worker group applies
``ray.remote``) and importable from this module, as Ray needs for classes touching
torch.distributed.

Each method returns its data and, in ``meta_info["metrics"]``, lists of metric values;
``DataProto.concat`` merges them over ranks and the driver reduces them. Worker-side phase
times go under ``timing_s/worker/*`` so ``benchmarks/step.py`` can tell compute from overhead.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.dispatch import Dispatch, register
from rlcore.interfaces import (
    BaseAlgorithm,
    BaseEngine,
    BaseRollout,
    EngineSpec,
    LossFn,
    RolloutSpec,
    SamplingParams,
)
from rlcore.plugins import default_registry
from rlcore.trainer.builder import build_algorithm
from rlcore.workers import Worker

if TYPE_CHECKING:
    import torch

    from rlcore.config import PluginSection, RunConfig
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = [
    "NAN_TEST_ENV",
    "POLICY_INPUT_KEYS",
    "ActorRolloutRefWorker",
    "CriticWorker",
    "schedule_steps",
]

# Test hook (documented, read in the worker process): a comma-separated list of training
# steps (1-based, as logged) whose policy loss is made NaN, to test the non-finite handling
# end to end. Unset in real runs.
NAN_TEST_ENV = "RLCORE_TEST_NAN_AT_STEPS"

# What a forward pass over (prompt, response) needs; the driver sends only these (plus the
# loss inputs) so per-row strings and dicts do not cross Ray.
POLICY_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def schedule_steps(config: RunConfig, total_steps: int, mini_batch_size: int, epochs: int) -> int:
    """Optimizer steps over the run, for the learning-rate schedule of an engine."""
    per_step = (config.data.train_batch_size // mini_batch_size) * epochs
    return max(1, total_steps * per_step)


@contextmanager
def _clock(timing: dict[str, list[float]], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timing.setdefault(f"timing_s/worker/{name}", []).append(time.perf_counter() - start)


def _add(metrics: dict[str, list[float]], new: dict[str, float]) -> None:
    for key, value in new.items():
        metrics.setdefault(key, []).append(float(value))


def _summed(timing: dict[str, list[float]]) -> dict[str, float]:
    """One total per phase for this call (a phase may run once per mini-batch)."""
    return {key: sum(values) for key, values in timing.items()}


def _build_engine(section: PluginSection, spec: EngineSpec, where: str) -> BaseEngine:
    cls = default_registry().resolve("engine", section.name, where=where)
    engine: BaseEngine = cls(spec, section.options)
    return engine


def _init_distributed(worker: Worker, config: RunConfig) -> None:
    worker.init_process_group("nccl" if config.resources.device == "cuda" else "gloo")


def _nan_test_steps() -> frozenset[int]:
    raw = os.environ.get(NAN_TEST_ENV, "").strip()
    return frozenset(int(x) for x in raw.split(",") if x.strip()) if raw else frozenset()


def _worker_state_file(directory: Path, rank: int) -> Path:
    return directory / f"worker_state_rank{rank}.pt"


def _save_worker_state(directory: Path, rank: int, extra: dict[str, int]) -> None:
    """This process's python/numpy/torch RNG (+ small counters); tensors and ints only."""
    import torch

    from rlcore.checkpoint import capture_rng_state

    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"rng": capture_rng_state(), **extra}, _worker_state_file(directory, rank))


def _load_worker_state(directory: Path, rank: int) -> dict[str, Any]:
    import torch

    from rlcore.checkpoint import CheckpointError, restore_rng_state

    file = _worker_state_file(directory, rank)
    if not file.is_file():
        msg = f"checkpoint {directory} has no {file.name}: it was written by other ranks"
        raise CheckpointError(msg)
    state: dict[str, Any] = torch.load(file, weights_only=True, map_location="cpu")
    restore_rng_state(state["rng"])
    return state


# Same names as rlcore.checkpoint.ACTOR_DIR / CRITIC_DIR (the checkpoint layout contract).
ACTOR_SUBDIR = "actor"
CRITIC_SUBDIR = "critic"


def _rollout_state(rollout: BaseRollout) -> dict[str, int]:
    """What makes the rollout's next samples (e.g. the HF rollout's per-call seed counter)."""
    return {f"rollout_{k}": int(v) for k, v in rollout.state_dict().items()}


def _restore_rollout_state(rollout: BaseRollout, state: dict[str, Any]) -> None:
    prefix = "rollout_"
    rollout.load_state_dict(
        {k.removeprefix(prefix): int(v) for k, v in state.items() if k.startswith(prefix)}
    )


def _nan_loss(loss_fn: Any) -> Any:
    """Wrap a loss so it is NaN (test hook, see ``NAN_TEST_ENV``); the graph stays intact."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        loss, metrics = loss_fn(*args, **kwargs)
        return loss * float("nan"), metrics

    return wrapped


def _train_mini_batches(
    role: str,
    engine: BaseEngine,
    loss_fn: LossFn,
    data: DataProto,
    cfg: RunConfig,
    *,
    mini_prompts: int | None,
    epochs: int,
    world_size: int,
    metrics: dict[str, list[float]],
    timing: dict[str, list[float]],
) -> None:
    """``epochs`` passes over this rank's mini-batches: one optimizer step per mini-batch.

    A mini-batch is ``mini_prompts`` prompts × ``n`` samples over all ranks, so
    ``mini_prompts * n // world_size`` rows here. Shuffling is seeded by the step, so a
    resumed run draws the same mini-batches.
    """
    mini = mini_prompts or cfg.data.train_batch_size
    rows = max(1, mini * cfg.rollout.n // world_size)
    step = int(data.meta_info.get("global_step", 0))
    batches = data.make_iterator(
        min(rows, len(data)),
        epochs,
        seed=cfg.trainer.seed + step,
        dataloader_kwargs={"shuffle": cfg.actor.shuffle},
    )
    for mini_batch in batches:
        with _clock(timing, f"{role}_forward_backward"):
            _add(metrics, engine.forward_backward(mini_batch, loss_fn))
        with _clock(timing, f"{role}_optimizer"):
            grad_norm = engine.optimizer_step()
        _add(
            metrics,
            {
                f"{role}/grad_norm": grad_norm,
                f"{role}/nonfinite": _nonfinite(grad_norm),
                **_lr(role, engine),
            },
        )


def _nonfinite(grad_norm: float) -> float:
    """1.0 when the engine skipped the update (non-finite loss or gradient), else 0.0."""
    return 0.0 if math.isfinite(grad_norm) else 1.0


class ActorRolloutRefWorker(Worker):
    """Actor engine + rollout (+ reference engine) in one process; see the module docstring.

    ``config``: the resolved run config. ``with_ref``: build the reference engine (the
    algorithm's ``needs_reference``). ``total_steps``: training steps of the run (for the LR
    schedule).
    """

    def __init__(self, config: RunConfig, *, with_ref: bool = False, total_steps: int = 1) -> None:
        super().__init__()
        self.config = config
        self.with_ref = with_ref
        self.total_steps = total_steps
        self.actor: BaseEngine | None = None
        self.rollout: BaseRollout | None = None
        self.ref: BaseEngine | None = None
        self.algorithm: BaseAlgorithm | None = None

    # --- construction ---------------------------------------------------------------------

    def _engine_spec(self, role: str) -> EngineSpec:
        cfg = self.config
        common: dict[str, Any] = {
            "model_path": cfg.model.path,
            "dtype": cfg.model.dtype,
            "trust_remote_code": cfg.model.trust_remote_code,
            "device": cfg.resources.device,
            "seed": cfg.trainer.seed,
        }
        if role == "ref":
            return EngineSpec(
                role="ref",
                optim=None,
                micro_batch_size=cfg.ref.micro_batch_size,
                max_tokens_per_micro_batch=cfg.ref.max_tokens_per_micro_batch,
                **common,
            )
        actor = cfg.actor
        mini = actor.ppo_mini_batch_size or cfg.data.train_batch_size
        return EngineSpec(
            role="actor",
            optim=actor.optim,
            total_steps=schedule_steps(cfg, self.total_steps, mini, actor.ppo_epochs),
            grad_clip=actor.grad_clip,
            micro_batch_size=actor.micro_batch_size,
            max_tokens_per_micro_batch=actor.max_tokens_per_micro_batch,
            gradient_checkpointing=actor.gradient_checkpointing,
            **common,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Join torch.distributed, build actor (+ ref) engines, algorithm, then the rollout.

        The rollout is built last so an inference engine sizes its cache from what is free,
        then loaded with the actor's weights once.
        """
        cfg = self.config
        _init_distributed(self, cfg)
        self.algorithm = build_algorithm(cfg)
        self.actor = _build_engine(cfg.actor.engine, self._engine_spec("actor"), "[actor.engine]")
        if self.with_ref:
            section = cfg.ref.engine or cfg.actor.engine
            self.ref = _build_engine(section, self._engine_spec("ref"), "[ref.engine]")
        rollout_cls = default_registry().resolve("rollout", cfg.rollout.name, where="[rollout]")
        spec = RolloutSpec(
            model_path=cfg.model.path,
            dtype=cfg.model.dtype,
            trust_remote_code=cfg.model.trust_remote_code,
            device=cfg.resources.device,
            max_prompt_length=cfg.data.max_prompt_length,
            max_response_length=cfg.data.max_response_length,
            # Ranks draw different samples; reruns reproduce.
            seed=cfg.trainer.seed + 1000 * self.rank,
        )
        self.rollout = rollout_cls(spec, cfg.rollout.options)
        self._sync_weights()
        log.info("rank %d: actor%s and rollout ready", self.rank, " + ref" if self.ref else "")

    def _sync_weights(self) -> None:
        # Every rank iterates: gathering a sharded parameter is collective.
        actor, rollout, _ = self._parts()
        rollout.update_weights(actor.named_parameters_for_sync())

    def _parts(self) -> tuple[BaseEngine, BaseRollout, BaseAlgorithm]:
        if self.actor is None or self.rollout is None or self.algorithm is None:
            msg = "ActorRolloutRefWorker: call init_model() first"
            raise RuntimeError(msg)
        return self.actor, self.rollout, self.algorithm

    # --- checkpoints ----------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Actor engine state into ``path/actor`` (every rank), plus this rank's RNG state.

        The reference engine is frozen at ``model.path``: nothing to save. The rollout's
        sampling counter is saved so resumed generation draws the same samples.
        """
        actor, rollout, _ = self._parts()
        out = Path(path) / ACTOR_SUBDIR
        actor.save_checkpoint(str(out))
        _save_worker_state(out, self.rank, _rollout_state(rollout))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Undo :meth:`save_checkpoint`, then copy the restored weights into the rollout."""
        actor, rollout, _ = self._parts()
        src = Path(path) / ACTOR_SUBDIR
        actor.load_checkpoint(str(src))
        state = _load_worker_state(src, self.rank)
        _restore_rollout_state(rollout, state)
        self._sync_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """The actor as a Hugging Face model folder (rank 0 writes; collective)."""
        actor, _, _ = self._parts()
        actor.export_hf(path)

    # --- generation -----------------------------------------------------------------------

    def sampling(self, validate: bool) -> SamplingParams:
        """Training sampling (``[rollout]``) or validation sampling (``[rollout.val]``)."""
        cfg = self.config
        max_new = cfg.data.max_response_length
        return cfg.rollout.val.sampling(max_new) if validate else cfg.rollout.sampling(max_new)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``n`` responses per prompt; ``meta_info["validate"]`` selects validation sampling."""
        _, rollout, _ = self._parts()
        timing: dict[str, list[float]] = {}
        with _clock(timing, "generate"):
            out = rollout.generate(prompts, self.sampling(bool(prompts.meta_info.get("validate"))))
            rollout.sleep()  # free inference memory for training (no-op on CPU)
        out.meta_info["metrics"] = _summed(timing)
        return out

    # --- forward passes -------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (B, R) of the responses under the current actor."""
        from rlcore.protocol import DataProto

        actor, _, _ = self._parts()
        timing: dict[str, list[float]] = {}
        with _clock(timing, "actor_forward"):
            outputs = actor.compute_log_prob(data)
        return DataProto.from_dict(
            tensors={"old_log_probs": _required(outputs.log_probs, "log_probs")},
            meta_info={"metrics": _summed(timing)},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` (B, R) under the frozen reference policy."""
        from rlcore.protocol import DataProto

        if self.ref is None:
            msg = "compute_ref_log_prob: this worker was built without a reference engine"
            raise RuntimeError(msg)
        timing: dict[str, list[float]] = {}
        with _clock(timing, "ref_forward"):
            outputs = self.ref.compute_log_prob(data)
        return DataProto.from_dict(
            tensors={"ref_log_prob": _required(outputs.log_probs, "log_probs")},
            meta_info={"metrics": _summed(timing)},
        )

    # --- update ---------------------------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """``ppo_epochs`` passes over mini-batches of this rank's rows, then weight sync.

        A mini-batch is ``ppo_mini_batch_size`` prompts × ``n`` samples over all ranks, so
        ``ppo_mini_batch_size * n // world_size`` rows here. Returns metrics only.
        """
        from rlcore.protocol import DataProto

        actor, _, algorithm = self._parts()
        cfg = self.config
        loss_fn = algorithm.policy_loss
        step = int(data.meta_info.get("global_step", 0))
        if step + 1 in _nan_test_steps():  # test hook: global_step counts completed steps
            loss_fn = _nan_loss(loss_fn)
        metrics: dict[str, list[float]] = {}
        timing: dict[str, list[float]] = {}
        _train_mini_batches(
            "actor",
            actor,
            loss_fn,
            data,
            cfg,
            mini_prompts=cfg.actor.ppo_mini_batch_size,
            epochs=cfg.actor.ppo_epochs,
            world_size=self.world_size,
            metrics=metrics,
            timing=timing,
        )
        with _clock(timing, "weight_sync"):
            self._sync_weights()
        return DataProto(meta_info={"metrics": {**metrics, **_summed(timing)}})


class CriticWorker(Worker):
    """The value model (PPO): ``compute_values`` and ``update_critic``."""

    def __init__(self, config: RunConfig, *, total_steps: int = 1) -> None:
        super().__init__()
        self.config = config
        self.total_steps = total_steps
        self.critic: BaseEngine | None = None
        self.algorithm: BaseAlgorithm | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        critic = cfg.critic
        _init_distributed(self, cfg)
        self.algorithm = build_algorithm(cfg)
        mini = critic.ppo_mini_batch_size or cfg.data.train_batch_size
        epochs = critic.ppo_epochs or cfg.actor.ppo_epochs
        spec = EngineSpec(
            role="critic",
            model_path=critic.model_path or cfg.model.path,
            dtype=cfg.model.dtype,
            trust_remote_code=cfg.model.trust_remote_code,
            device=cfg.resources.device,
            optim=critic.optim,
            total_steps=schedule_steps(cfg, self.total_steps, mini, epochs),
            grad_clip=critic.grad_clip,
            micro_batch_size=critic.micro_batch_size,
            max_tokens_per_micro_batch=critic.max_tokens_per_micro_batch,
            gradient_checkpointing=critic.gradient_checkpointing,
            value_head=True,
            seed=cfg.trainer.seed,
        )
        self.critic = _build_engine(critic.engine or cfg.actor.engine, spec, "[critic.engine]")
        log.info("rank %d: critic ready", self.rank)

    def _parts(self) -> tuple[BaseEngine, BaseAlgorithm]:
        if self.critic is None or self.algorithm is None:
            msg = "CriticWorker: call init_model() first"
            raise RuntimeError(msg)
        return self.critic, self.algorithm

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Critic engine state into ``path/critic`` (every rank)."""
        critic, _ = self._parts()
        out = Path(path) / CRITIC_SUBDIR
        critic.save_checkpoint(str(out))
        _save_worker_state(out, self.rank, {})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        critic, _ = self._parts()
        src = Path(path) / CRITIC_SUBDIR
        critic.load_checkpoint(str(src))
        _load_worker_state(src, self.rank)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): the critic's estimate before each response token."""
        from rlcore.protocol import DataProto

        critic, _ = self._parts()
        timing: dict[str, list[float]] = {}
        with _clock(timing, "critic_forward"):
            values = critic.compute_values(data)
        return DataProto.from_dict(
            tensors={"values": values}, meta_info={"metrics": _summed(timing)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """``ppo_epochs`` passes of the algorithm's value loss over mini-batches; metrics only."""
        from rlcore.protocol import DataProto

        critic, algorithm = self._parts()
        cfg = self.config
        metrics: dict[str, list[float]] = {}
        timing: dict[str, list[float]] = {}
        _train_mini_batches(
            "critic",
            critic,
            algorithm.value_loss,
            data,
            cfg,
            mini_prompts=cfg.critic.ppo_mini_batch_size,
            epochs=cfg.critic.ppo_epochs or cfg.actor.ppo_epochs,
            world_size=self.world_size,
            metrics=metrics,
            timing=timing,
        )
        return DataProto(meta_info={"metrics": {**metrics, **_summed(timing)}})


def _required(tensor: torch.Tensor | None, what: str) -> torch.Tensor:
    if tensor is None:
        msg = f"the engine's compute_log_prob returned no {what}"
        raise RuntimeError(msg)
    return tensor


def _lr(role: str, engine: BaseEngine) -> dict[str, float]:
    # ``lr`` is not part of the engine contract; engines that expose it get it logged.
    value = getattr(engine, "lr", None)
    return {f"{role}/lr": float(value)} if isinstance(value, int | float) else {}
