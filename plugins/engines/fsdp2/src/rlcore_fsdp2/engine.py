"""FSDP2Engine: one Hugging Face model (actor, critic or reference) sharded with ``fully_shard``.

The same code runs on CPU (gloo) and GPU (NCCL): each decoder layer and then the root module
are wrapped with ``fully_shard`` over a device mesh of all ranks of the default process group
(a 2-D replicate x shard mesh when ``fsdp_size`` is smaller than the world: HSDP).

Loss normalisation (see :class:`rlcore.interfaces.BatchTotals`): the engine computes the
mini-batch totals across micro-batches and ranks (:func:`rlcore.engine.batch_totals`),
the loss function divides by them, and the engine backpropagates ``loss * dp_size`` because
FSDP averages gradients over ranks. The sum of the micro-batch gradients is then exactly the
gradient of the global loss, however the mini-batch was split. The micro-batch loop, the
optimizer step's guard (non-finite skip, counters), the LR (passed in by the worker), the
device set-up and the dtype names come from :mod:`rlcore.engine`; this module is the
model, its sharding, one micro-batch's forward, state and export. LoRA is a
:class:`~rlcore_fsdp2.lora.LoraAdapter` the engine holds.
"""

from __future__ import annotations

import functools
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from rlcore.checkpoint.safe_load import (
    UnsafeCheckpointError,
    safe_dcp_load,
    weights_only_refusal,
)
from rlcore.engine import (
    GuardedSteps,
    OptimizerGuard,
    accumulate_gradients,
    copy_tokenizer_files,
    dtype_from_name,
    forward_micro_batches,
    init_device,
)
from rlcore.errors import ConfigError, EngineError
from rlcore.interfaces import (
    BaseEngine,
    EngineSpec,
    LossFn,
    ModelOutputs,
    TokenDistributions,
    key,
)
from rlcore.protocol import DataProto
from rlcore_fsdp2 import forward, packing, reward_head
from rlcore_fsdp2.compiled import CompiledUpdate
from rlcore_fsdp2.lora import LoraAdapter, LoraSettings
from rlcore_fsdp2.weights import gathered, whole_local_tensors

log = logging.getLogger(__name__)


class FSDP2Error(EngineError):
    """The FSDP2 engine cannot do what was asked (missing checkpoint, wrong role, ...)."""


class FSDP2Engine(GuardedSteps, BaseEngine):
    """A :class:`~rlcore.interfaces.BaseEngine` on torch FSDP2 (``fully_shard``).

    Extra public surface beyond the contract: ``lr`` (the learning rate of the last step),
    ``global_step`` (optimizer steps taken), ``skipped_steps`` (steps skipped for a non-finite
    grad norm), ``dp_rank``/``dp_size``, ``model`` (the sharded module) and ``device``.
    """

    # spec.compile: the update runs a torch.compile'd model at bucketed shapes
    # (rlcore_fsdp2.compiled); the inference passes stay eager.
    supports_compile = True

    @attrs.frozen(kw_only=True)
    class Config(BaseEngine.Config):
        """Options of ``[actor.engine]`` (also ``[critic.engine]``, ``[ref.engine]``)."""

        # With an optimizer and spec.dtype below float32: keep float32 master weights and
        # compute in spec.dtype (FSDP2 MixedPrecisionPolicy). False trains in spec.dtype.
        mixed_precision: bool = key(
            True,
            "With an optimizer and model.dtype below float32: keep float32 master "
            "weights and compute in model.dtype (FSDP2 MixedPrecisionPolicy); "
            "false: train in model.dtype.",
        )
        reduce_dtype: Literal["float32", "bfloat16"] = key(
            "float32", "Dtype of the gradient reduction across ranks under mixed_precision."
        )
        reshard_after_forward: bool = key(
            True,
            "Free the gathered parameters after each forward (FSDP2's "
            "reshard_after_forward): less memory, one more all-gather in the "
            "backward.",
        )
        # Keep the parameter shards (and so the optimizer step) on CPU (GPU runs only).
        offload_params: bool = key(
            False, "Keep the parameter shards (and so the optimizer step) on CPU (GPU runs only)."
        )
        # Move parameters and optimizer state to CPU while the colocated rollout generates
        # (the worker calls offload()/onload() around generation; GPU runs only). Frees memory
        # for the rollout's cache at the cost of two host transfers per step.
        offload_during_generation: bool = key(
            False,
            "Move parameters and optimizer state to CPU while the colocated rollout "
            "generates (GPU runs only): memory for the rollout's cache, two host "
            "transfers per step.",
        )
        # Ranks per shard group; -1 shards over all ranks. Smaller: HSDP (replicate x shard).
        fsdp_size: int = key(
            -1,
            "Ranks per shard group; -1: shard over all ranks; smaller: HSDP (replicate x shard).",
            allowed="-1 or >= 1",
        )
        attn_implementation: str = key(
            "sdpa",
            "transformers' attn_implementation of the model (sdpa, eager, flash_attention_2, ...).",
        )
        # Padding-free micro-batches (verl's name): each micro-batch's valid tokens run as one
        # packed sequence, attention kept within rows (rlcore_fsdp2.packing). Exact. On by
        # default: faster on both models of benchmarks/packing.py (CPU; GPU unmeasured).
        use_remove_padding: bool = key(
            True,
            "Padding-free micro-batches (verl's name): each micro-batch's valid "
            "tokens run as one packed sequence, attention kept within rows. Exact.",
        )
        # With use_remove_padding and sdpa/eager attention: adjacent rows with the same prompt
        # (GRPO/RLOO's n samples) run that prompt once per micro-batch, each response
        # attending to the shared copy (rlcore_fsdp2.packing). Exact to float rounding.
        # flash_attention_* keep one segment per row (their varlen kernels cannot share).
        share_prompts: bool = key(
            True,
            "With use_remove_padding and sdpa/eager attention: adjacent rows with "
            "the same prompt (the n samples) run that prompt once per micro-batch. "
            "Exact to float rounding.",
        )
        # Response tokens per float32 log-softmax chunk (rlcore.engine); 0: one chunk.
        log_prob_chunk_tokens: int = key(
            1024,
            "Response tokens per float32 log-softmax chunk (bounds the logits "
            "memory); 0: one chunk.",
            validator=attrs.validators.ge(0),
        )
        # LoRA through peft (rlcore-fsdp2[lora]); verl's names. lora_rank = 0: full training.
        # With LoRA and no separate [ref.engine], the reference is this engine, adapters off.
        lora_rank: int = key(
            0,
            "LoRA rank through peft (rlcore-fsdp2[lora]); 0: full training. With "
            "LoRA and no [ref.engine] of its own, the reference is this engine with "
            "adapters off.",
            validator=attrs.validators.ge(0),
        )
        lora_alpha: float = key(
            16.0, "LoRA alpha (peft's lora_alpha).", validator=attrs.validators.gt(0.0)
        )
        lora_dropout: float = key(
            0.0,
            "LoRA dropout (peft's lora_dropout).",
            validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)],
        )
        # "all-linear": every linear layer but the output head (peft's shortcut), or names.
        target_modules: str | tuple[str, ...] = key(
            "all-linear",
            'Modules that get LoRA adapters: "all-linear" (every linear layer but '
            "the output head) or a list of names.",
        )
        exclude_modules: tuple[str, ...] = key((), "Module names left without LoRA adapters.")

        @property
        def lora(self) -> LoraSettings | None:
            if self.lora_rank == 0:
                return None
            return LoraSettings(
                rank=self.lora_rank,
                alpha=self.lora_alpha,
                dropout=self.lora_dropout,
                target_modules=self.target_modules,
                exclude_modules=self.exclude_modules,
            )

        @fsdp_size.validator
        def _check_fsdp_size(self, attribute: Any, value: int) -> None:
            if value != -1 and value < 1:
                msg = f"fsdp_size must be -1 (all ranks) or >= 1, got {value}"
                raise ValueError(msg)

    @classmethod
    def preflight(
        cls, spec: EngineSpec, config: BaseEngine.Config, *, world_size: int, where: str
    ) -> None:
        """Before Ray starts: ``fsdp_size`` against the processes, LoRA targets against the
        model's modules (built on the meta device: :func:`rlcore_fsdp2.lora.check_lora_targets`),
        ``compile`` not with LoRA."""
        if not isinstance(config, FSDP2Engine.Config):
            return
        size = config.fsdp_size
        if size not in (-1, world_size) and world_size % size:
            msg = (
                f"{where.strip('[]')}.fsdp_size = {size} must divide the number of processes "
                f"({world_size}: resources.nnodes x resources.processes_per_node); -1: all"
            )
            raise ConfigError(msg)
        settings = config.lora if spec.role != "ref" else None
        if settings is not None and spec.compile:  # peft's wrapped model is not measured compiled
            msg = (
                f"{spec.role}.compile = true with {where.strip('[]')}.lora_rank = "
                f"{config.lora_rank}: the compiled update does not support LoRA; set one of "
                "them off"
            )
            raise ConfigError(msg)
        if settings is not None:
            from rlcore_fsdp2.lora import check_lora_targets

            check_lora_targets(spec, settings, where=where)

    def __init__(self, spec: EngineSpec, config: FSDP2Engine.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: FSDP2Engine.Config
        if spec.micro_batch_size is None and spec.max_tokens_per_micro_batch is None:
            msg = f"[{spec.role}] set micro_batch_size or max_tokens_per_micro_batch"
            raise ConfigError(msg)
        # The seed: the critic's fresh value head is identical on all ranks.
        self.device = init_device(spec.device, seed=spec.seed)
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        self.mesh = self._build_mesh()

        self.model = self._load_model()
        # LoRA on the trained roles only: a separately built reference stays the base model.
        trained = spec.role != "ref" and not spec.reward_head
        settings = self.config.lora if trained else None
        self.lora = LoraAdapter(settings, spec, self.device) if settings is not None else None
        if self.lora is not None:
            self.model = self.lora.wrap(self.model)
        self._shard(self.model)
        self._compiled: CompiledUpdate | None = None
        if spec.compile and spec.optim is not None and trained:
            self._compiled = CompiledUpdate(self.model, spec, self.device)
        self.optimizer: torch.optim.Optimizer | None = None
        self._guard: OptimizerGuard | None = None
        if spec.optim is not None and spec.role != "ref":
            self._build_optimizer()
        self._offloaded = False

    # --- construction ---------------------------------------------------------------------

    def _build_mesh(self) -> DeviceMesh:
        size = self.config.fsdp_size
        if size in (-1, self.dp_size):
            return init_device_mesh(self.device.type, (self.dp_size,), mesh_dim_names=("fsdp",))
        if self.dp_size % size:
            msg = f"fsdp_size={size} must divide the world size {self.dp_size}"
            raise ConfigError(msg)
        return init_device_mesh(
            self.device.type, (self.dp_size // size, size), mesh_dim_names=("ddp", "fsdp")
        )

    def _load_model(self) -> torch.nn.Module:
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoModelForTokenClassification,
        )

        spec = self.spec
        trains = spec.optim is not None and spec.role != "ref"
        master = (
            torch.float32 if trains and self.config.mixed_precision else dtype_from_name(spec.dtype)
        )
        attn = self.config.attn_implementation
        # The reward model scores padded rows (rlcore_fsdp2.reward_head), never packed ones.
        if self.config.use_remove_padding and not spec.reward_head:
            try:
                attn = packing.attention_for_packing(attn)
            except ValueError as err:
                raise ConfigError(f"[{spec.role}.engine] {err}") from err
        kwargs: dict[str, Any] = {
            "dtype": master,
            "trust_remote_code": spec.trust_remote_code,
            "attn_implementation": attn,
        }
        try:
            if spec.reward_head:
                # verl's reward model: a sequence classifier, one label, as it was saved.
                model = AutoModelForSequenceClassification.from_pretrained(
                    spec.model_path, **kwargs
                )
                reward_head.check_reward_head(model, spec.model_path)
                if model.config.pad_token_id is None:
                    # transformers' own pooling refuses b > 1 without one; its pooled output
                    # is not used (the score is read at each row's last attended token).
                    eos = model.config.eos_token_id
                    model.config.pad_token_id = eos if isinstance(eos, int) else 0
            elif spec.value_head:
                # verl's critic: the causal LM's backbone plus a fresh 1-output score head.
                hf_config = AutoConfig.from_pretrained(
                    spec.model_path, trust_remote_code=spec.trust_remote_code
                )
                hf_config.num_labels = 1
                hf_config.classifier_dropout = 0.0  # deterministic values, as verl's critic
                model = AutoModelForTokenClassification.from_pretrained(
                    spec.model_path, config=hf_config, **kwargs
                )
            else:
                model = AutoModelForCausalLM.from_pretrained(spec.model_path, **kwargs)
        except OSError as err:
            msg = f"[{spec.role}] cannot load a model from model_path={spec.model_path!r}: {err}"
            raise ConfigError(msg) from err
        model.config.use_cache = False
        if spec.gradient_checkpointing:
            # Non-reentrant: works with FSDP2 hooks and inputs that need no grad.
            kwargs_ = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs_)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs_)
        return model

    def _shard(self, model: torch.nn.Module) -> None:
        spec, cfg = self.spec, self.config
        kwargs: dict[str, Any] = {
            "mesh": self.mesh,
            "reshard_after_forward": cfg.reshard_after_forward,
        }
        compute = dtype_from_name(spec.dtype)
        if cfg.mixed_precision and compute != torch.float32 and spec.optim is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=compute, reduce_dtype=dtype_from_name(cfg.reduce_dtype)
            )
        if cfg.offload_params and self.device.type == "cuda":
            kwargs["offload_policy"] = CPUOffloadPolicy()
        layer_classes = set(getattr(model, "_no_split_modules", None) or [])
        layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
        if not layers:
            msg = f"[{spec.role}] found no decoder layers ({layer_classes}) to shard in the model"
            raise FSDP2Error(msg)
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)

    def _build_optimizer(self) -> None:
        optim = self.spec.optim
        assert optim is not None
        # Frozen parameters (the base weights under LoRA) get neither grads nor AdamW state.
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        self._guard = OptimizerGuard(
            self.optimizer, role=self.spec.role, max_norm=self.spec.grad_clip
        )

    # --- forward passes -------------------------------------------------------------------

    def _forward(
        self, mb: DataProto, *, temperature: float, with_entropy: bool, entropy_grad: bool
    ) -> ModelOutputs:
        """One micro-batch forward (padded or packed: the same outputs); (b, R) on device."""
        options = self._scoring(temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)
        if not self.config.use_remove_padding:
            return forward.padded_forward(self.model, mb, self.device, options)
        try:
            packed = packing.pack(
                mb.batch["input_ids"].to(self.device),
                mb.batch["attention_mask"].to(self.device),
                mb.batch["position_ids"].to(self.device),
                mb.batch["responses"].to(self.device),
                share_prompts=self._share_prompts,
            )
        except ValueError as err:
            raise FSDP2Error(f"[{self.spec.role}] {err}") from err
        return forward.packed_forward(self.model, packed, options)

    def _scoring(
        self, temperature: float, *, with_entropy: bool, entropy_grad: bool
    ) -> forward.Scoring:
        return forward.Scoring(
            value_head=self.spec.value_head,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            chunk_tokens=self.config.log_prob_chunk_tokens or None,
        )

    @functools.cached_property
    def _share_prompts(self) -> bool:
        """Shared-prompt packing is on and the loaded attention implements it."""
        attn = getattr(self.model.config, "_attn_implementation", None)
        return self.config.share_prompts and attn == packing.VARLEN_SDPA

    def _batching(self) -> dict[str, Any]:
        """How this engine's micro-batch loop splits (rlcore.engine.accumulate_gradients)."""
        return {
            "spec": self.spec,
            "device": self.device,
            "packed": self.config.use_remove_padding,
            "share_prompts": self._share_prompts,
            # Token budgets split ranks differently: every rank runs the same FSDP collectives.
            "match_ranks": True,
        }

    def forward_backward(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        temperature: float,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """Accumulate gradients of ``loss_fn`` over this rank's share of a mini-batch.

        Metrics are averaged over micro-batches weighted by their valid response tokens.
        Ranks with fewer micro-batches (dynamic batching) run zero-weight passes on one of
        their rows so every rank issues the same FSDP collectives.
        """
        self._require_guard(FSDP2Error)
        self.onload()
        self.model.train()
        eager = functools.partial(
            self._forward, temperature=temperature, with_entropy=True, entropy_grad=with_entropy
        )
        compiled = self._compiled
        if compiled is not None:
            scoring = self._scoring(temperature, with_entropy=True, entropy_grad=with_entropy)
            step_forward = functools.partial(compiled.forward, eager=eager, scoring=scoring)
        metrics = accumulate_gradients(
            batch,
            loss_fn,
            eager if compiled is None else step_forward,
            # FSDP averages gradients over ranks; the loss is already normalised globally.
            loss_scale=float(self.dp_size),
            **self._batching(),
        )
        if compiled is not None:
            metrics.update(compiled.finish())
        return metrics

    def optimizer_step(self, *, lr: float) -> float:
        guard = self._require_guard(FSDP2Error)
        if self._compiled is not None:
            self._compiled.stepped()
        return guard.step(lr=lr, parameters=self.model.parameters())

    def _inference(
        self, batch: DataProto, *, temperature: float, with_entropy: bool
    ) -> ModelOutputs:
        self.onload()
        self.model.eval()
        return forward_micro_batches(
            batch,
            functools.partial(
                self._forward,
                temperature=temperature,
                with_entropy=with_entropy,
                entropy_grad=False,
            ),
            **self._batching(),
        )

    def compute_log_prob(
        self, batch: DataProto, *, temperature: float, with_entropy: bool = False
    ) -> ModelOutputs:
        if self.spec.value_head:
            msg = f"[{self.spec.role}] a value-head engine has no log-probs; use compute_values"
            raise FSDP2Error(msg)
        return self._inference(batch, temperature=temperature, with_entropy=with_entropy)

    def next_token_distributions(
        self, batch: DataProto, *, hidden_states: bool = False
    ) -> TokenDistributions:
        """The padded forward of :meth:`compute_log_prob` (same dtype policy), whole vocab."""
        if self.spec.value_head or self.spec.reward_head:
            return super().next_token_distributions(batch, hidden_states=hidden_states)
        from rlcore.engine.token_distributions import hf_next_token_distributions

        self.onload()
        self.model.eval()
        return hf_next_token_distributions(
            self.model, batch, self.device, hidden_states=hidden_states
        )

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        if not self.spec.value_head:
            return super().compute_values(batch)
        values = self._inference(batch, temperature=1.0, with_entropy=False).values
        assert values is not None  # a value head fills values
        return values

    def compute_rm_score(self, batch: DataProto) -> torch.Tensor:
        """The reward model's score of each row (``spec.reward_head``): (B,) on CPU."""
        if not self.spec.reward_head:
            return super().compute_rm_score(batch)
        self.onload()
        self.model.eval()
        return reward_head.score_rows(
            self.model,
            batch,
            self.device,
            micro_batch_size=self.spec.micro_batch_size,
            max_tokens_per_micro_batch=self.spec.max_tokens_per_micro_batch,
        )

    # --- weights out ----------------------------------------------------------------------

    @torch.no_grad()
    def named_parameters_for_sync(
        self, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors in HF naming, gathered a bucket at a time (collective on every rank).

        Tensors stay on the engine's device (cast to ``dtype`` when given); tied weights come
        under both names (``lm_head.weight`` and ``model.embed_tokens.weight``), gathered once.
        One all-gather per bucket (:func:`rlcore_fsdp2.weights.gathered`).
        """
        self.onload()
        if self.lora is not None:  # W + scaling * B @ A under plain HF names
            yield from self.lora.merged_for_sync(dtype)
            return
        yield from gathered(self.model, lambda name: True, dtype, self.device)

    def shared_parameters_for_sync(self) -> dict[str, torch.Tensor] | None:
        """The live parameters when this rank holds each whole (one rank, or HSDP shard
        groups of one): the colocated rollout then reads them without a copy. None under
        LoRA (the rollout wants merged weights) and when the engine offloads during generation
        (the rollout's hold would keep the device memory the offload frees)."""
        cfg = self.config
        if self.lora is not None or (
            self.device.type == "cuda" and cfg.offload_during_generation and not cfg.offload_params
        ):
            return None
        self.onload()
        return whole_local_tensors(self.model)

    def export_hf(self, path: str) -> None:
        """Rank 0 writes config, safetensors and the tokenizer files of ``model_path``.

        Under LoRA: the merged model (``W + scaling * B @ A``), a plain transformers folder.
        """
        if self.lora is not None:
            self.lora.export_merged(path)
            return
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        if self.dp_rank == 0:
            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(out, state_dict=state, safe_serialization=True)
            source = Path(self.spec.model_path)
            copy_tokenizer_files(source, out)
        dist.barrier()

    # --- checkpoints ----------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        if self.optimizer is None:
            state = {"model": get_model_state_dict(self.model)}
        else:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
        if self.lora is not None:  # the base weights come from model_path: adapters only
            state["model"] = LoraAdapter.adapter_state(state["model"])
        return state

    def save_checkpoint(self, path: str) -> None:
        """Sharded model + optimizer (torch.distributed.checkpoint) and per-rank counters.

        RNG and the LR schedule's position are the worker's (saved once, next to this).
        """
        self.onload()
        Path(path).mkdir(parents=True, exist_ok=True)
        dcp.save(self._state(), checkpoint_id=path)
        extra: dict[str, Any] = {
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
        }
        if self._compiled is not None:  # where it compiles rather than runs eager once
            extra["compiled_eager_passes"] = self._compiled.state_dict()
        torch.save(extra, Path(path) / f"extra_state_rank{self.dp_rank}.pt")
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        extra_file = Path(path) / f"extra_state_rank{self.dp_rank}.pt"
        if not extra_file.is_file():
            msg = f"[{self.spec.role}] no engine checkpoint at {path!r} (missing {extra_file.name})"
            raise FSDP2Error(msg)
        self.onload()
        state = self._state()
        safe_dcp_load(state, path)  # never runs code from a crafted checkpoint
        set_state_dict(
            self.model,
            self.optimizer if self.optimizer is not None else [],
            model_state_dict=state["model"],
            optim_state_dict=state.get("optim", {}),
            options=StateDictOptions(strict=self.lora is None),
        )
        if self._guard is not None:  # an engine without an optimizer takes no steps
            try:
                state = torch.load(extra_file, weights_only=True, map_location="cpu")
                self._guard.load_state_dict(state)
                if self._compiled is not None:
                    self._compiled.load_state_dict(state.get("compiled_eager_passes", []))
            except pickle.UnpicklingError as err:  # verification refuses it first; this backs it
                msg = f"refusing to load {extra_file}: {weights_only_refusal(err)}"
                raise UnsafeCheckpointError(msg) from None
            except (KeyError, TypeError, ValueError, RuntimeError, EOFError) as err:
                msg = f"[{self.spec.role}] {extra_file} is damaged ({type(err).__name__}: {err})"
                raise FSDP2Error(msg) from None

    # --- offload (colocated with a GPU rollout) ---------------------------------------------

    def offload(self) -> None:
        """Move parameter shards and optimizer state to CPU (GPU only; no-op on CPU).

        Only with ``offload_during_generation``; with ``offload_params`` (CPUOffloadPolicy)
        both live on CPU already: nothing to do.
        """
        cfg = self.config
        if (
            self.device.type != "cuda"
            or not cfg.offload_during_generation
            or cfg.offload_params
            or self._offloaded
        ):
            return
        self.model.to("cpu")
        _move_optimizer_state(self.optimizer, torch.device("cpu"))
        torch.cuda.empty_cache()
        self._offloaded = True

    def onload(self) -> None:
        if not self._offloaded:
            return
        self.model.to(self.device)
        _move_optimizer_state(self.optimizer, self.device)
        self._offloaded = False

    # --- LoRA (the work is in rlcore_fsdp2.lora.LoraAdapter; peft is imported only when on) ---

    @property
    def ref_in_actor(self) -> bool:
        """Under LoRA the reference is this engine with its adapters off (no second copy)."""
        return self.lora is not None

    def compute_ref_log_prob(self, batch: DataProto, *, temperature: float) -> ModelOutputs:
        if self.lora is None:
            return super().compute_ref_log_prob(batch, temperature=temperature)
        with self.lora.disabled():
            return self.compute_log_prob(batch, temperature=temperature)

    def adapter_for_sync(self) -> tuple[dict[str, Any], Iterator[tuple[str, torch.Tensor]]] | None:
        if self.lora is None:
            return None
        return self.lora.for_sync()

    def export_adapter(self, path: str) -> None:
        if self.lora is None:
            return super().export_adapter(path)
        self.lora.export_adapter(path)


# --- helpers ------------------------------------------------------------------------------


def _move_optimizer_state(optimizer: torch.optim.Optimizer | None, device: torch.device) -> None:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                state[name] = value.to(device, non_blocking=True)
