"""MegatronEngine: one HF Qwen2/Llama model as a megatron-core ``GPTModel``, TP x PP x DP.

Every rank of the default process group holds one (tensor-parallel shard of one pipeline
stage of the) model. Ranks of one data-parallel group receive the *same* rows (the worker
registers ``dispatch_info()`` for rlcore's mesh dispatch); only the collect rank's outputs are
gathered, but every rank returns the same outputs, so plain calls work too.

Forward and backward go through megatron's pipeline schedule
(``get_forward_backward_func``): without pipelining it is a plain loop over micro-batches,
with it the 1F1B schedule and its point-to-point sends. Loss normalisation is rlcore's
(:class:`rlcore.interfaces.BatchTotals`): each micro-batch loss is divided by the mini-batch
totals and the schedule is told not to rescale (``calculate_per_token_loss``); data-parallel
gradients are then summed (:func:`rlcore_megatron.parallel.reduce_gradients`). The schedule
runs the micro-batch loop itself; the totals, the token-weighted metric means, the optimizer
step's guard (non-finite skip, counters), the device set-up and the dtype names are
:mod:`rlcore.engine`'s, as for every engine.

On CPU (gloo) the engine enters :func:`rlcore_megatron.cpu_compat.cpu_compat` around megatron
calls; on GPU it does not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rlcore.dispatch import DispatchInfo
from rlcore.engine import (
    GuardedSteps,
    MetricMeans,
    OptimizerGuard,
    batch_totals,
    split_micro_batches,
    token_weight,
)
from rlcore.errors import ConfigError
from rlcore.interfaces import BaseEngine, BatchTotals, EngineSpec, LossFn, ModelOutputs
from rlcore.protocol import DataProto
from rlcore_megatron.checkpoint_io import export_engine, load_engine, save_engine
from rlcore_megatron.config_checks import LORA_UNSUPPORTED as LORA_UNSUPPORTED
from rlcore_megatron.cpu_compat import cpu_compat, install_cpu_rng_tracker
from rlcore_megatron.errors import MegatronError as MegatronError
from rlcore_megatron.forward import (
    attention_mask,
    freeze_padding_embedding,
    response_slice,
    set_position_ids,
    use_position_ids,
)
from rlcore_megatron.mapping import (
    MappingError,
    ModelDims,
    megatron_names,
    merge_to_hf,
)
from rlcore_megatron.mcore_optimizer import (
    McoreOptimizer,
    uses_mcore_optimizer,
)
from rlcore_megatron.model import build_model, global_name, layer_offset, transformer_config
from rlcore_megatron.options import MegatronOptions
from rlcore_megatron.parallel import (
    broadcast_from_stage,
    clip_grad_norm,
    init_parallel,
    reduce_gradients,
    stage_of,
)

log = logging.getLogger(__name__)


def _single_process() -> bool:
    return not dist.is_initialized() or dist.get_world_size() == 1


class MegatronEngine(GuardedSteps, BaseEngine):
    """A :class:`~rlcore.interfaces.BaseEngine` on megatron-core (tensor/pipeline/data parallel).

    Extra public surface beyond the contract: ``layout`` (sizes and ranks), ``compute_logits``
    (full-vocab logits, for tests), ``global_step``, ``skipped_steps``, ``lr`` (the learning
    rate of the last step), ``model``, ``dims`` and ``mcore_optimizer``.
    """

    @attrs.frozen(kw_only=True)
    class Config(MegatronOptions):
        """Options of ``[actor.engine]`` (also ``[critic.engine]``, ``[ref.engine]``)."""

        # The keys themselves: rlcore_megatron.options.MegatronOptions.

    @classmethod
    def preflight(
        cls, spec: EngineSpec, config: BaseEngine.Config, *, world_size: int, where: str
    ) -> None:
        """Before Ray starts: ``tensor_parallel * pipeline_parallel`` against the role's
        processes, and ``tensor_parallel`` against the heads, KV heads and MLP width of the
        model's ``config.json`` (``pipeline_parallel`` against its layers)."""
        if not isinstance(config, MegatronEngine.Config):
            return
        key = where.strip("[]")
        tp, pp = config.tensor_parallel, config.pipeline_parallel
        trains = spec.optim is not None and spec.role != "ref"
        if tp * pp > 1 and not trains and world_size == 1:
            return  # runs unsharded (see __init__)
        if world_size % (tp * pp):
            msg = (
                f"{key}.tensor_parallel * pipeline_parallel = {tp} * {pp} = {tp * pp} must divide "
                f"the number of processes ({world_size}: resources.nnodes x "
                "resources.processes_per_node)"
            )
            raise ConfigError(msg)
        try:
            raw = json.loads((Path(spec.model_path) / "config.json").read_text(encoding="utf-8"))
            hf_config = types.SimpleNamespace(**raw)
            try:
                dims = ModelDims.from_hf_config(hf_config, value_head=spec.value_head)
            except MappingError as err:  # the model itself (its type), whatever the layout
                raise ConfigError(f"{key} (model {spec.model_path}): {err}") from None
            try:
                ModelDims.from_hf_config(hf_config, tp=tp, value_head=spec.value_head)
            except MappingError as err:
                what = str(err).removeprefix(f"tensor_parallel={tp} ")
                msg = f"{key}.tensor_parallel = {tp} {what} of the model at {spec.model_path}"
                raise ConfigError(msg) from None
        except (OSError, ValueError, TypeError, AttributeError) as err:
            log.debug("%s: model dimensions not checked before start: %s", where, err)
            return
        if dims.layers % pp:
            msg = (
                f"{key}.pipeline_parallel = {pp} must divide the model's num_hidden_layers "
                f"({dims.layers}): stages hold equal numbers of layers"
            )
            raise ConfigError(msg)

    def __init__(self, spec: EngineSpec, config: MegatronEngine.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: MegatronEngine.Config
        where = f"[{spec.role}.engine]"
        trains = spec.optim is not None and spec.role != "ref"
        sharded = self.config.tensor_parallel * self.config.pipeline_parallel > 1
        if sharded and not trains and _single_process():
            # One process that only reads weights (rlcore export of a TP/PP checkpoint): run
            # unsharded; load_checkpoint merges the saved shards. Same numbers, one process.
            log.info("%s: one process, no optimizer: running unsharded (tp = pp = 1)", where)
            self.config = attrs.evolve(
                self.config, tensor_parallel=1, pipeline_parallel=1, sequence_parallel=False
            )
        cfg = self.config
        # megatron-core's DDP + optimizer (bf16 with float32 main params, ZeRO-1), or the plain
        # path (torch AdamW on float32 parameters): mcore_optimizer.uses_mcore_optimizer.
        dist_opt = cfg.use_distributed_optimizer
        uses_mcore = trains and uses_mcore_optimizer(spec.device, spec.dtype, dist_opt)
        bf16 = uses_mcore and spec.dtype == "bfloat16"
        if trains and spec.dtype != "float32" and not bf16:
            # Not silent: only bfloat16 has megatron's mixed precision here (float16 would need
            # loss scaling); the plain path trains float32 parameters.
            log.warning(
                "%s: the megatron engine trains in float32 here (model.dtype = %s is used by "
                "the reference and the export only; bfloat16 training takes megatron's mixed "
                "precision on GPU or with use_distributed_optimizer = true)",
                where,
                spec.dtype,
            )
        self._cpu = spec.device == "cpu"
        self.device, self.layout = init_parallel(
            spec.device, tp=cfg.tensor_parallel, pp=cfg.pipeline_parallel, where=where
        )
        from transformers import AutoConfig

        try:
            self.hf_config = AutoConfig.from_pretrained(
                spec.model_path, trust_remote_code=spec.trust_remote_code
            )
        except OSError as err:
            msg = f"[{spec.role}] cannot load a model config from model_path={spec.model_path!r}"
            raise ConfigError(f"{msg}: {err}") from err
        layers = int(self.hf_config.num_hidden_layers)
        if layers % cfg.pipeline_parallel:
            msg = (
                f"{where} pipeline_parallel = {cfg.pipeline_parallel} must divide the model's "
                f"num_hidden_layers ({layers}): stages hold equal numbers of layers"
            )
            raise ConfigError(msg)
        with self._compat():
            if self._cpu:
                install_cpu_rng_tracker(spec.seed)
            else:
                from megatron.core import tensor_parallel

                tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
            try:
                self.mcore_config = transformer_config(
                    self.hf_config,
                    tp=cfg.tensor_parallel,
                    pp=cfg.pipeline_parallel,
                    sequence_parallel=cfg.sequence_parallel,
                    # Training in bfloat16: megatron's optimizer keeps float32 main params;
                    # otherwise a training model's own parameters are the float32 masters.
                    dtype="bfloat16" if bf16 else "float32" if trains else spec.dtype,
                    on_cpu=self._cpu,
                    recompute=spec.gradient_checkpointing,
                )
                self.model, self.dims = build_model(
                    self.hf_config,
                    self.mcore_config,
                    model_path=spec.model_path,
                    value_head=spec.value_head,
                    seed=spec.seed,
                    device=self.device,
                )
            except MappingError as err:
                raise ConfigError(f"[{spec.role}] {err}") from err
        use_position_ids(self.model)
        freeze_padding_embedding(self.model, getattr(self.hf_config, "pad_token_id", None))
        self._offset = layer_offset(self.mcore_config)
        self.optimizer: torch.optim.Optimizer | None = None
        self._mcore: McoreOptimizer | None = None
        self._guard: OptimizerGuard | None = None
        if uses_mcore:
            assert spec.optim is not None
            with self._compat():
                self._mcore = McoreOptimizer(
                    self.model, self.mcore_config, spec.optim, bf16=bf16, distributed=dist_opt
                )
            self._guard = self._mcore.guard(role=spec.role, max_norm=spec.grad_clip)
        elif trains:
            self._build_optimizer()

    # --- construction ---------------------------------------------------------------------

    def _compat(self) -> contextlib.AbstractContextManager[None]:
        return cpu_compat() if self._cpu else contextlib.nullcontext()

    def _build_optimizer(self) -> None:
        optim = self.spec.optim
        assert optim is not None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
        )
        # Materialise the state now (AdamW with step 0 and zero moments is a fresh AdamW), so
        # a checkpoint has the same keys before and after the first step.
        for p in params:
            self.optimizer.state[p] = {
                "step": torch.zeros((), dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        self._guard = OptimizerGuard(
            self.optimizer, role=self.spec.role, max_norm=self.spec.grad_clip
        )

    def dispatch_info(self) -> DispatchInfo:
        """This rank's data-parallel place (the role worker registers it for mesh dispatch)."""
        return DispatchInfo(
            dp_rank=self.layout.dp_rank, dp_size=self.layout.dp, is_collect=self.layout.is_collect
        )

    # --- modes ----------------------------------------------------------------------------

    def train_mode(self) -> None:
        self.model.train()

    def eval_mode(self) -> None:
        self.model.eval()

    @property
    def mcore_optimizer(self) -> McoreOptimizer | None:
        """megatron-core's DDP + optimizer this engine trains through (None: the plain path)."""
        return self._mcore

    @property
    def _tied_output(self) -> bool:
        return self.dims.tie_embeddings

    # --- the schedule ---------------------------------------------------------------------

    def _micro_batches(self, batch: DataProto) -> list[DataProto]:
        if len(batch) == 0:
            msg = f"[{self.spec.role}] rank {dist.get_rank()} got an empty batch"
            raise MegatronError(msg)
        return split_micro_batches(
            batch,
            micro_batch_size=self.spec.micro_batch_size,
            max_tokens=self.spec.max_tokens_per_micro_batch,
        )

    def _run(
        self,
        batch: DataProto,
        head: Any,
        *,
        forward_only: bool,
    ) -> list[Any]:
        """Run the schedule over ``batch``'s micro-batches; ``head(output, mb)`` on the last stage.

        ``head`` returns ``(loss, tokens, info)``; the infos of the last stage come back, in
        micro-batch order (an empty list on other stages).
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self._check_same_rows(batch)
        mbs = self._micro_batches(batch)
        device = self.device
        model = self.model
        length = int(batch.batch["input_ids"].shape[1])
        pad = -length % self.layout.tp if self.config.sequence_parallel else 0

        def forward_step(data_iterator: Iterator[DataProto], model_: Any) -> Any:
            mb = next(data_iterator)
            ids = mb.batch["input_ids"].to(device)
            valid = mb.batch["attention_mask"].to(device)
            pos = mb.batch["position_ids"].to(device)
            if pad:  # sequence parallel splits the sequence: left-pad to a multiple of tp
                ids, valid, pos = (torch.nn.functional.pad(t, (pad, 0)) for t in (ids, valid, pos))
            set_position_ids(model, pos)
            output = model_(
                ids, pos, attention_mask(valid), runtime_gather_output=not self.spec.value_head
            )
            return output, lambda out: head(out, mb)

        fb = get_forward_backward_func()
        # megatron's DDP wrapper (its grad hooks fill the grad buffers), or the model itself
        scheduled = self._mcore.module if self._mcore is not None else model
        with self._compat():
            infos = fb(
                forward_step_func=forward_step,
                data_iterator=iter(mbs),
                model=[scheduled],
                num_microbatches=len(mbs),
                seq_length=length + pad,
                micro_batch_size=int(mbs[0].batch["input_ids"].shape[0]),
                forward_only=forward_only,
            )
        set_position_ids(model, None)
        return list(infos)

    def _check_same_rows(self, batch: DataProto) -> None:
        """Fail loudly when the ranks of one model replica got different rows.

        Tensor- and pipeline-parallel ranks must see the same rows (mesh dispatch does that);
        plain data-parallel dispatch would hand them different halves and the model would
        silently compute garbage. One small all-reduce of a fingerprint over the
        model-parallel group.
        """
        if self.layout.tp * self.layout.pp == 1:
            return
        from megatron.core import parallel_state as ps

        ids = batch.batch["input_ids"].long().reshape(-1)
        weights = torch.arange(ids.numel(), dtype=torch.int64) % 65521 + 1
        digest = int(((ids % 65521) * weights).sum()) % (2**31 - 1)
        fingerprint = torch.tensor([len(batch), digest], dtype=torch.int64, device=self.device)
        both = torch.cat([fingerprint, -fingerprint])
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=ps.get_model_parallel_group())
        if not torch.equal(both[:2], -both[2:]):
            msg = (
                f"[{self.spec.role}] the tensor/pipeline-parallel ranks of one data-parallel "
                "group received different rows: call this engine through "
                "Dispatch.MESH_COMPUTE_PROTO and register engine.dispatch_info() with "
                "Worker.set_dispatch_info"
            )
            raise MegatronError(msg)

    def _outputs(
        self,
        out: torch.Tensor,
        mb: DataProto,
        *,
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
    ) -> ModelOutputs:
        """(b, R) log-probs / entropy / values of one micro-batch from the last stage's output."""
        responses = mb.batch["responses"].to(self.device)
        r = responses.shape[1]
        if self.spec.value_head:
            return ModelOutputs(values=response_slice(out, r)[..., 0].float())
        logits = response_slice(out, r)[..., : self.dims.vocab].float()
        if temperature not in (0.0, 1.0):  # 0: greedy sampling scores the unscaled logits
            # Sampling used logits / T; log-probs of the same distribution need the same scaling.
            logits = logits / temperature
        picked = torch.gather(logits, -1, responses.unsqueeze(-1)).squeeze(-1)
        lse = torch.logsumexp(logits, dim=-1)
        outputs = ModelOutputs(log_probs=picked - lse)
        if entropy:
            with contextlib.nullcontext() if entropy_grad else torch.no_grad():
                probs = torch.softmax(logits, dim=-1)
                outputs.entropy = lse - (probs * logits).sum(dim=-1)
        return outputs

    def _broadcast_from_last_stage(self, obj: Any) -> Any:
        """The last pipeline stage's Python value, on every stage (small objects only)."""
        if self.layout.pp == 1:
            return obj
        from megatron.core import parallel_state as ps

        box = [obj]
        dist.broadcast_object_list(
            box,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
        return box[0]

    # --- training -------------------------------------------------------------------------

    def _totals(self, batch: DataProto) -> BatchTotals:
        """Totals over this data-parallel group (its TP/PP ranks hold the same rows)."""
        from megatron.core import parallel_state as ps

        return batch_totals(batch, self.device, group=ps.get_data_parallel_group())

    def forward_backward(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        temperature: float,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """Accumulate gradients of ``loss_fn`` over this data-parallel group's mini-batch rows.

        Metrics are averaged over micro-batches weighted by their valid response tokens.
        """
        self._require_guard(MegatronError)
        self.model.train()
        totals = self._totals(batch)
        temp = float(temperature)

        def head(out: torch.Tensor, mb: DataProto) -> Any:
            outputs = self._outputs(
                out, mb, temperature=temp, entropy=True, entropy_grad=with_entropy
            )
            loss, metrics = loss_fn(outputs, mb, totals)
            tokens = torch.tensor(1, dtype=torch.int)  # the schedule must not rescale
            return loss, tokens, {"weight": token_weight(mb), "metrics": dict(metrics)}

        means = MetricMeans()  # only the last stage computes the loss: the others stay empty
        for info in self._run(batch, head, forward_only=False):
            means.add(info["metrics"], info["weight"])
        result: dict[str, float] = self._broadcast_from_last_stage(means.result())
        return result

    def optimizer_step(self, *, lr: float) -> float:
        """Sum DP gradients, clip to ``spec.grad_clip`` (global TP x PP norm), step at ``lr``."""
        guard = self._require_guard(MegatronError)
        if self._mcore is not None:  # megatron's reduction, main grads, its clipping
            with self._compat():
                return guard.step(lr=lr, clip=self._mcore.clip)
        reduce_gradients(self.model, self.layout, tied_output=self._tied_output)

        def clip(max_norm: float) -> float:  # the norm over TP x PP, not torch's local one
            return clip_grad_norm(self.model, self.layout, max_norm, tied_output=self._tied_output)

        return guard.step(lr=lr, clip=clip)

    # --- inference ------------------------------------------------------------------------

    @torch.no_grad()
    def _infer(self, batch: DataProto, pick: Any) -> list[Any]:
        self.model.eval()

        def head(out: torch.Tensor, mb: DataProto) -> Any:
            return out.new_zeros(()), torch.tensor(1, dtype=torch.int), pick(out, mb)

        infos = self._run(batch, head, forward_only=True)
        result: list[Any] = self._broadcast_from_last_stage(infos)
        return result

    def compute_log_prob(
        self, batch: DataProto, *, temperature: float, with_entropy: bool = False
    ) -> ModelOutputs:
        if self.spec.value_head:
            msg = f"[{self.spec.role}] a value-head engine has no log-probs; use compute_values"
            raise MegatronError(msg)
        temp = float(temperature)

        def pick(out: torch.Tensor, mb: DataProto) -> tuple[torch.Tensor, torch.Tensor | None]:
            o = self._outputs(out, mb, temperature=temp, entropy=with_entropy, entropy_grad=False)
            assert o.log_probs is not None
            ent = o.entropy.cpu() if o.entropy is not None else None
            return o.log_probs.cpu(), ent

        parts = self._infer(batch, pick)
        log_probs = torch.cat([lp for lp, _ in parts])
        entropy = torch.cat([e for _, e in parts]) if with_entropy else None
        return ModelOutputs(log_probs=log_probs, entropy=entropy)

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        if not self.spec.value_head:
            return super().compute_values(batch)

        def pick(out: torch.Tensor, mb: DataProto) -> torch.Tensor:
            values = self._outputs(out, mb, temperature=1.0, entropy=False, entropy_grad=False)
            assert values.values is not None
            return values.values.cpu()

        return torch.cat(self._infer(batch, pick))

    def compute_logits(self, batch: DataProto) -> torch.Tensor:
        """Full-vocabulary float32 logits (B, P+R, V) of every position (tests, debugging)."""

        def pick(out: torch.Tensor, mb: DataProto) -> torch.Tensor:
            length = mb.batch["input_ids"].shape[1]  # drop sequence-parallel padding columns
            return out[:, -length:, : self.dims.vocab].float().cpu()

        return torch.cat(self._infer(batch, pick))

    # --- weights out ----------------------------------------------------------------------

    def _local_params(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under global megatron names."""
        return {
            global_name(name, self._offset): p
            for name, p in self.model.state_dict(keep_vars=True).items()
            if not name.endswith("_extra_state")
        }

    @torch.no_grad()
    def named_parameters_for_sync(
        self, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors, one megatron parameter at a time (collective on every rank).

        The stage owning a parameter gathers its tensor-parallel shards; with pipeline
        parallelism it then broadcasts the full tensor to the other stages, so every rank
        yields the whole model (each rank's rollout needs it). Tensors stay on the engine's
        device (cast to ``dtype`` when given).
        """
        from megatron.core import parallel_state as ps

        local = self._local_params()
        tp_group = ps.get_tensor_model_parallel_group()
        pp_group = ps.get_pipeline_model_parallel_group()
        for name in megatron_names(self.dims):
            mine = local.get(name)
            parts: list[torch.Tensor] = []
            if mine is not None:
                tensor = mine.detach().to(dtype or mine.dtype)
                if self.layout.tp > 1 and getattr(mine, "tensor_model_parallel", False):
                    parts = [torch.empty_like(tensor) for _ in range(self.layout.tp)]
                    dist.all_gather(parts, tensor.contiguous(), group=tp_group)
                else:
                    parts = [tensor]
            if self.layout.pp > 1:
                owner = stage_of(name, self.dims.layers, self.layout.pp)
                parts = broadcast_from_stage(
                    parts,
                    owner,
                    self.layout.pp_rank,
                    pp_group,
                    dtype or self._sync_dtype(),
                    self.device,
                )
            yield from merge_to_hf(name, parts, self.dims)

    def _sync_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def export_hf(self, path: str) -> None:
        """Rank 0 writes config, safetensors and the tokenizer files of ``model_path``."""
        export_engine(self, path)

    # --- checkpoints (rlcore_megatron.checkpoint_io) ----------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Model + optimizer shards (torch.distributed.checkpoint), counters as JSON."""
        save_engine(self, path)

    def load_checkpoint(self, path: str) -> None:
        load_engine(self, path)
