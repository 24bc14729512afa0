"""HFRollout: generation with Hugging Face transformers ``generate`` (CPU or GPU).

No inference engine beyond transformers: the reference rollout, the one that runs anywhere
(tests, CPU quickstart, machines without vLLM). Layout follows :class:`BaseRollout`: one
response per input row (the driver repeated each prompt ``n`` times already), right-padded to
exactly ``max_new_tokens``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import attrs
import torch

from rlcore.engine import dtype_from_name, position_ids_from_mask, rollout_tensors
from rlcore.engine.tokenizer import special_ids
from rlcore.errors import ConfigError, RlcoreError
from rlcore.interfaces import BaseRollout, RolloutSpec, SamplingParams, TokenDistributions, key
from rlcore.protocol import DataProto

log = logging.getLogger(__name__)


class WeightSyncError(RlcoreError):
    """A streamed tensor does not fit the rollout model (unknown name or wrong shape)."""


class HFRollout(BaseRollout):
    """A :class:`~rlcore.interfaces.BaseRollout` on ``model.generate``.

    Extra public surface: ``model`` (the HF model), ``device``, ``eos_token_ids``,
    ``pad_token_id``.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseRollout.Config):
        """Options of ``[rollout]`` for ``name = "hf"``."""

        max_batch_size: int | None = key(
            None,
            "Prompts per generate call; unset: the whole batch at once.",
            allowed=">= 1 (or unset)",
        )
        attn_implementation: str = key(
            "sdpa", "transformers' attn_implementation of the generating model."
        )
        # The buffer: rlcore_hf.kv_cache.
        preallocate_kv_cache: bool = key(
            True,
            "Write keys/values in place into a buffer sized for prompt + "
            "max_new_tokens instead of transformers' DynamicCache (which copies the "
            "cache every step). Same tokens.",
        )

        # rlcore_hf.sampler; measured 0.05 vs 0.84 ms per step for 128 rows on a CPU.
        inverse_cdf_sampling: bool = key(
            True,
            "Draw each sampled token by inverse CDF (a cumulative sum and searchsorted) "
            "instead of torch.multinomial, which is ~15x slower per step on a CPU. The same "
            "distribution, another random stream: false reproduces transformers' own draws.",
        )

        share_prompt_prefill: bool | None = key(
            None,
            "Prefill each distinct prompt once and copy its KV cache and last logits to "
            "its n samples (identical adjacent rows), instead of prefilling every row; the "
            "decode batch and its random draws are unchanged. Unset: on for device = 'cpu' "
            "(measured: the same tokens and log-probs), off on CUDA (not measured there: GPU "
            "matmuls may round a prompt differently in a smaller batch). When no prompt "
            "repeats (validation), the head all prompts share (a chat template's system "
            "prompt) is prefilled once instead.",
        )

        share_prompt_kv: bool | None = key(
            None,
            "With the shared prefill, also keep each prompt's keys/values once for its n "
            "samples while decoding (each step reads them once per prompt, not once per "
            "sample), with attn_implementation 'sdpa'. Unset: as share_prompt_prefill.",
        )

        # rlcore_hf.compiled_decode; measured in benchmarks/rollout.py.
        compile_decode: bool = key(
            False,
            "Decode with a torch.compile'd one-token step over a static KV cache (prefill "
            "stays eager), in a loop of the rollout's own instead of transformers' generate. "
            "Compiles once per shape met (rows padded to a power of two >= 8, prompt + "
            "max_new_tokens to a multiple of 64), tens of seconds each on a CPU (in the "
            "background: compile_in_background). Greedy "
            "tokens as generate's up to the compiled kernels' rounding; sampling draws the same "
            "random stream. Replaces preallocate_kv_cache and share_prompt_kv while on.",
        )
        # rlcore_hf.compile_warmup; measured in README.md ("A whole quickstart run with
        # compiled decoding").
        compile_in_background: bool = key(
            True,
            "With compile_decode on a CPU: compile each new shape in a child process (into "
            "inductor's on-disk cache) while this rollout decodes with generate, then load it "
            "(seconds) instead of waiting for the compile (tens of seconds). Which call "
            "switches depends on timing, so reruns match only up to the compiled kernels' "
            "rounding; false: wait for each compile (reruns and resumes reproduce exactly).",
        )

        @max_batch_size.validator
        def _check_max_batch_size(self, attribute: Any, value: int | None) -> None:
            if value is not None and value < 1:
                msg = f"max_batch_size must be >= 1 or unset, got {value}"
                raise ValueError(msg)

    def __init__(self, spec: RolloutSpec, config: HFRollout.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: HFRollout.Config
        from transformers import GenerationConfig

        if spec.device == "cuda" and not torch.cuda.is_available():
            msg = "[rollout] device = 'cuda' but torch sees no CUDA device; use device = 'cpu'"
            raise ConfigError(msg)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if spec.device == "cuda"
            else torch.device("cpu")
        )
        attn_implementation = self.config.attn_implementation
        if self.config.compile_decode and attn_implementation == "sdpa":
            from rlcore_hf.compiled_decode import attention_for_compiled_decode

            attn_implementation = attention_for_compiled_decode()  # sdpa, ours when decoding
        elif self._shares_prompt_kv():
            from rlcore_hf.prefix_attention import attention_for_prefix_sharing

            attn_implementation = attention_for_prefix_sharing()  # sdpa, or ours when decoding
        try:
            model = load_model(
                spec.model_path, spec.dtype, spec.trust_remote_code, attn_implementation
            )
        except OSError as err:
            msg = f"[rollout] cannot load a model from model_path={spec.model_path!r}: {err}"
            raise ConfigError(msg) from err
        self.model = model.to(self.device).eval()
        self.eos_token_ids, self.pad_token_id = _special_ids(spec, model)
        # Own the sampling: a checkpoint's generation_config (Qwen's repetition_penalty=1.05,
        # top_k=20, ...) would otherwise fill every knob a call leaves unset.
        self.model.generation_config = GenerationConfig(
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            bos_token_id=model.generation_config.bos_token_id,
        )
        self._decoder: Any = None  # rlcore_hf.compiled_decode.CompiledDecoder, built on first use
        self._calls = 0
        self._asleep = False
        self._shares_weights = False  # the model reads the actor's tensors (share_weights)

    # --- generation -----------------------------------------------------------------------

    def _generate_kwargs(self, sampling: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "eos_token_id": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
            "use_cache": True,
        }
        if sampling.greedy:
            kwargs.update(do_sample=False)
        elif self.config.inverse_cdf_sampling:
            from transformers import LogitsProcessorList

            from rlcore_hf.sampler import InverseCdfSampler

            # A greedy generate whose last processor samples: argmax picks its draw.
            sampler = InverseCdfSampler(
                temperature=sampling.temperature, top_k=max(sampling.top_k, 0), top_p=sampling.top_p
            )
            kwargs.update(do_sample=False, logits_processor=LogitsProcessorList([sampler]))
        else:
            kwargs.update(
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0,  # 0 disables top-k
            )
        if sampling.return_log_probs:
            kwargs.update(return_dict_in_generate=True, output_logits=True)
        return kwargs

    @torch.no_grad()
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """One response per prompt row; see :class:`BaseRollout` for the layout.

        Returns tensors only (``prompts``, ``responses``, ``response_mask``, ``input_ids``,
        ``attention_mask``, ``position_ids``, optionally ``rollout_log_probs``), so the driver
        can ``batch.union(gen)`` without key clashes.
        """
        self.wake_up()
        input_ids = prompts.batch["input_ids"]  # (B, P), left-padded
        attention_mask = prompts.batch["attention_mask"]
        position_ids = prompts.batch.get("position_ids")
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        step = self.config.max_batch_size or len(prompts)
        seed = self.spec.seed + self._calls
        self._calls += 1
        kwargs = self._generate_kwargs(sampling)
        responses, log_probs = [], []
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)  # spec.seed + call counter: reruns reproduce
            for start in range(0, len(prompts), step):
                ids = input_ids[start : start + step].to(self.device)
                mask = attention_mask[start : start + step].to(self.device)
                if self.config.compile_decode and self._decoder_ready(ids, mask, sampling):
                    resp, logits = self._compiled_generate(ids, mask, sampling)
                    responses.append(resp)
                    if sampling.return_log_probs:
                        log_probs.append(
                            _sampled_log_probs(logits, resp, sampling, sampling.max_new_tokens)
                        )
                    continue
                prefixed = self._common_prefix(ids, mask, sampling)
                if prefixed is not None:  # distinct prompts, one shared head
                    gen_ids, gen_mask, cache_kwargs = prefixed
                    out = self.model.generate(
                        input_ids=gen_ids, attention_mask=gen_mask, **kwargs, **cache_kwargs
                    )
                else:
                    cache_kwargs = self._cache_kwargs(sampling)
                    with self._shared_prefill(ids, mask), self._shared_kv(cache_kwargs):
                        out = self.model.generate(
                            input_ids=ids, attention_mask=mask, **kwargs, **cache_kwargs
                        )
                sequences = out.sequences if sampling.return_log_probs else out
                resp = sequences[:, ids.shape[1] :]  # (b, <= R)
                responses.append(_pad_right(resp, sampling.max_new_tokens, self.pad_token_id))
                if sampling.return_log_probs:
                    log_probs.append(
                        _sampled_log_probs(out.logits, resp, sampling, sampling.max_new_tokens)
                    )

        response_ids = torch.cat(responses).cpu()  # (B, R)
        response_mask = _response_mask(response_ids, self.eos_token_ids)  # (B, R)
        tensors = rollout_tensors(
            input_ids, attention_mask, position_ids, response_ids, response_mask,
            log_probs=torch.cat(log_probs).cpu() if sampling.return_log_probs else None,
        )  # fmt: skip
        return DataProto.from_dict(tensors=tensors)

    def _decoder_ready(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingParams
    ) -> bool:
        """Whether this call decodes compiled; False while its shape compiles in the
        background (rlcore_hf.compile_warmup): the call decodes with generate meanwhile."""
        from rlcore_hf.compiled_decode import CompiledDecoder

        if self._decoder is None:
            warmup = None
            if self.config.compile_in_background and self.device.type == "cpu":
                from rlcore_hf.compile_warmup import WarmupSpec

                warmup = WarmupSpec(
                    model_path=self.spec.model_path,
                    dtype=self.spec.dtype,
                    trust_remote_code=self.spec.trust_remote_code,
                    attn_implementation=self.model.config._attn_implementation,
                )
            self._decoder = CompiledDecoder(self.model, warmup)
        rows, width = ids.shape
        return bool(self._decoder.ready(rows, width, sampling.max_new_tokens, mask.dtype))

    def _compiled_generate(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingParams
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Responses (b, max_new_tokens) and raw logits per step (rlcore_hf.compiled_decode)."""
        from rlcore_hf.sampler import InverseCdfSampler, MultinomialSampler

        sampler = None
        if not sampling.greedy:
            kind = InverseCdfSampler if self.config.inverse_cdf_sampling else MultinomialSampler
            sampler = kind(
                temperature=sampling.temperature, top_k=max(sampling.top_k, 0), top_p=sampling.top_p
            )
        resp, logits = self._decoder.generate(
            ids, mask, sampling,
            eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id, sampler=sampler,
        )  # fmt: skip
        return resp, tuple(logits)

    def _shares_prefill(self) -> bool:
        share = self.config.share_prompt_prefill
        return self.device.type == "cpu" if share is None else share

    def _shares_prompt_kv(self) -> bool:
        if self.config.compile_decode:
            return False  # its prefix-reading attention does not fit the static cache
        share = self.config.share_prompt_kv
        on = self._shares_prefill() if share is None else share
        return on and self.config.preallocate_kv_cache and self.config.attn_implementation == "sdpa"

    def _shared_prefill(
        self, ids: torch.Tensor, mask: torch.Tensor
    ) -> contextlib.AbstractContextManager[Any]:
        """One prefill per distinct prompt in ``generate`` (rlcore_hf.shared_prefill), if on."""
        if not self._shares_prefill():
            return contextlib.nullcontext()
        from rlcore_hf.shared_prefill import shared_prefill

        return shared_prefill(self.model, ids, mask)

    def _common_prefix(
        self, ids: torch.Tensor, mask: torch.Tensor, sampling: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]] | None:
        """The rows and a cache holding the head they all share, prefilled once
        (:mod:`rlcore_hf.common_prefix`); None: some prompt repeats, or no long shared head."""
        if not (self._shares_prefill() and self.config.preallocate_kv_cache):
            return None
        from rlcore_hf.common_prefix import MIN_PREFIX, common_prefix_length, prefilled
        from rlcore_hf.kv_cache import cache_keyword, growing_cache
        from rlcore_hf.shared_prefill import prompt_groups

        if prompt_groups(ids, mask) is not None:  # repeated prompts: the shared prefill's case
            return None
        prefix = common_prefix_length(ids, mask)
        if prefix < MIN_PREFIX:
            return None
        reserve = ids.shape[1] - prefix + sampling.max_new_tokens
        cache = growing_cache(self.model, reserve=reserve)
        if cache is None:
            return None
        gen_ids, gen_mask = prefilled(self.model, ids, mask, prefix, cache)
        return gen_ids, gen_mask, {cache_keyword(type(self.model)): cache}

    def _shared_kv(self, cache_kwargs: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """Decoding that reads each prompt's keys once (rlcore_hf.prefix_attention), if on."""
        if not (cache_kwargs and self._shares_prompt_kv()):
            return contextlib.nullcontext()
        from rlcore_hf.prefix_attention import decoding_with

        (cache,) = cache_kwargs.values()
        return decoding_with(cache)

    def _cache_kwargs(self, sampling: SamplingParams) -> dict[str, Any]:
        """A fresh preallocated KV cache for one ``generate`` call (none: transformers')."""
        if not self.config.preallocate_kv_cache:
            return {}
        from rlcore_hf.kv_cache import cache_keyword, growing_cache

        share = self._shares_prompt_kv()
        cache = growing_cache(self.model, reserve=sampling.max_new_tokens, share_prefix=share)
        if cache is None:
            return {}
        return {cache_keyword(type(self.model)): cache}

    def next_token_distributions(
        self, batch: DataProto, *, hidden_states: bool = False
    ) -> TokenDistributions:
        """The generating model's own forward (its dtype and attention) over ``batch``."""
        from rlcore.engine.token_distributions import hf_next_token_distributions

        return hf_next_token_distributions(
            self.model, batch, self.device, hidden_states=hidden_states
        )

    # --- weights --------------------------------------------------------------------------

    @torch.no_grad()
    def state_dict(self) -> dict[str, int]:
        # Each generate call seeds with spec.seed + calls: resuming needs the counter.
        return {"calls": self._calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._calls = int(state.get("calls", 0))

    def share_weights(self, named_tensors: dict[str, torch.Tensor]) -> bool:
        """Read the actor's live tensors as the model's weights (the colocated sync, no copy).

        Only when every parameter and persistent buffer of the model has a tensor of its
        name, shape, dtype and device (else False, nothing changed: the worker streams, and
        :meth:`update_weights` casts). The model's own storage is then released; the actor
        owns the weights, so :meth:`sleep` leaves them where they are.
        """
        targets = self._targets()
        persistent = set(self.model.state_dict())
        for name, target in targets.items():
            tensor = named_tensors.get(name)
            if tensor is None and name not in persistent:
                continue  # a non-persistent buffer (rotary inv_freq): the engine has none
            if tensor is None or (tensor.shape, tensor.dtype, tensor.device) != (
                target.shape,
                target.dtype,
                target.device,
            ):
                return False
        for name, target in targets.items():
            if name in named_tensors and target.data_ptr() != named_tensors[name].data_ptr():
                target.data = named_tensors[name]
        self._shares_weights = True
        return True

    def _targets(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers by every name, tied ones under both (remove_duplicate)."""
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(dict(self.model.named_buffers(remove_duplicate=False)))
        return targets

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each streamed (HF name, full tensor) into the model, casting dtype/device.

        Tied weights are reached under both names (``remove_duplicate=False``), so a stream
        that sends either (or both) of ``lm_head.weight``/``model.embed_tokens.weight`` works;
        a tensor streamed under both is copied once.
        """
        from rlcore.workers.weight_push import SeenTensors

        targets = self._targets()
        if self._shares_weights:  # never write into the actor's storage: own a copy again
            for target in {id(t): t for t in targets.values()}.values():
                target.data = target.data.clone()
            self._shares_weights = False
        copied: dict[int, SeenTensors] = {}  # per target: the tensors already copied into it
        loaded = 0
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                msg = f"[rollout] weight sync sent {name!r}, which the rollout model does not have"
                raise WeightSyncError(msg)
            if target.shape != tensor.shape:
                msg = (
                    f"[rollout] weight sync: {name!r} has shape {tuple(tensor.shape)}, "
                    f"the rollout model expects {tuple(target.shape)}"
                )
                raise WeightSyncError(msg)
            if copied.setdefault(id(target), SeenTensors()).first_time(tensor):
                target.data.copy_(tensor, non_blocking=True)
            loaded += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        log.debug("weight sync: %d tensors loaded", loaded)

    def sleep(self) -> None:
        """Move the model to CPU to free GPU memory for training (no-op on CPU)."""
        if self.device.type == "cuda" and not self._asleep and not self._shares_weights:
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.model.to(self.device)
            self._asleep = False


# --- helpers ------------------------------------------------------------------------------


def load_model(
    model_path: str, dtype: str, trust_remote_code: bool, attn_implementation: str
) -> Any:
    """The rollout's model as it loads it; rlcore_hf.compile_warmup's child loads its copy
    here too, so both compile the same graph."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_path,
        dtype=dtype_from_name(dtype),
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
    )


def _special_ids(spec: RolloutSpec, model: Any) -> tuple[list[int], int]:
    """EOS ids (generation config + model config + tokenizer) and the pad id."""
    return special_ids(
        spec.model_path,
        trust_remote_code=spec.trust_remote_code,
        eos=(model.generation_config.eos_token_id, model.config.eos_token_id),
        pad=model.generation_config.pad_token_id,
    )


def _pad_right(tokens: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    """(b, r) -> (b, length), filled with ``pad_id`` (generate stops early when all rows end)."""
    if tokens.shape[1] == length:
        return tokens
    out = tokens.new_full((tokens.shape[0], length), pad_id)
    out[:, : tokens.shape[1]] = tokens
    return out


def _response_mask(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after: (b, R) int64.

    Computed from EOS, not from ``!= pad``, because pad and EOS may share an id.
    """
    is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype))
    # Count of EOS strictly before each position: 0 means "still inside the response".
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def _sampled_log_probs(
    logits: tuple[torch.Tensor, ...], responses: torch.Tensor, sampling: SamplingParams, length: int
) -> torch.Tensor:
    """log p(token) under softmax(logits / T), float32, padded to ``length``: (b, R).

    Raw logits (not the top-k/top-p-filtered scores), so the value matches the training
    engine's ``compute_log_prob`` with the same temperature.
    """
    stacked = torch.stack(logits, dim=1).float()  # (b, r, V)
    if not sampling.greedy and sampling.temperature != 1.0:
        stacked = stacked / sampling.temperature
    picked = torch.gather(stacked, -1, responses.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(stacked, dim=-1)  # (b, r)
    out = lp.new_zeros((lp.shape[0], length))
    out[:, : lp.shape[1]] = lp
    return out
