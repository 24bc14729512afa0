"""SGLangRollout: generation on SGLang's offline ``Engine`` (CUDA GPU).

Written against SGLang 0.5.23 (the PyPI wheel ``sglang-0.5.23``; paths below are under
``python/sglang/`` in that release, lines as in it). Every SGLang API this module calls:

- ``sglang.Engine`` -- lazy alias of ``srt.entrypoints.engine.Engine`` (``__init__.py:68``);
  ``Engine.__init__(**kwargs)`` builds ``ServerArgs(**kwargs)`` (``engine.py:278``). The
  ``ServerArgs`` fields set here (``srt/arg_groups/fields/``): ``model_path`` (model.py:51),
  ``tokenizer_path`` (serving.py:32),
  ``trust_remote_code`` (model.py:106), ``dtype`` (model.py:160: "float32", "bfloat16",
  "float16" accepted as rlcore spells them), ``tp_size`` (parallel.py:45),
  ``mem_fraction_static`` (schedule.py:27), ``enable_memory_saver`` (exec_.py:58, needed by
  release/resume below), ``enable_deterministic_inference`` (exec_.py:1153),
  ``base_gpu_id`` (device.py:28), ``random_seed`` (device.py:47), ``log_level``
  (observability.py:31), ``sampling_defaults`` (serving.py:232). ``ServerArgs`` itself
  (``srt/server_args.py:551``) is a ``msgspec`` Struct: its ``__struct_fields__`` name the
  keys ``[rollout].server_args`` may add, checked before any process starts.
- ``Engine.async_generate(input_ids=..., sampling_params=..., return_logprob=...)``
  (``engine.py:545``; the same arguments as ``Engine.generate``, ``engine.py:433``), run on the
  engine's own loop ``Engine.loop`` (``engine.py:396``) under ``asyncio.wait_for`` so that the
  wait is bounded; ``generate_one``, awaited on any loop (the agent loop's own), hands the
  request to that same loop run in a thread of ours (SGLang's tokenizer manager serves the
  first loop that sends it a request, ``srt/managers/tokenizer_manager.py:2440``; see
  ``SGLangRollout._serve_loop``).
  Output shape and finish reasons: see :mod:`rlcore_sglang.translate`.
- ``Engine.begin_weight_update()`` / ``Engine.end_weight_update()`` (``engine.py:1643``,
  ``:1650``): since 0.5.23 ``update_weights_from_tensor`` fails outside such a session
  (``srt/managers/scheduler_components/weight_updater.py:232-238``). Called when present.
- ``Engine.update_weights_from_tensor(named_tensors=[(hf_name, tensor), ...],
  flush_cache=False)`` (``engine.py:1679``): the engine serialises the list once per TP rank
  with ``MultiprocessingSerializer`` (``engine.py:1743-1758``; ``srt/utils/common.py:3060``,
  torch's ``ForkingPickler``: CUDA tensors cross by IPC handle, rebuilt by SGLang's
  ``SafeUnpickler``, ``common.py:3144``, which admits ``rebuild_cuda_tensor``, ``:3329``; so
  each bucket is moved to this GPU first, in the rollout dtype) and returns ``(success,
  message)`` (``srt/managers/tokenizer_control_mixin.py:563-596``). Names are the HF
  checkpoint's; SGLang's model ``load_weights`` stacks q/k/v and gate/up itself.
- ``Engine.flush_cache()`` (``engine.py:1506``) once after the last bucket: returns
  ``FlushCacheReqOutput(success, message)`` (``srt/managers/io_struct.py:1859``); refused while
  requests run (``srt/managers/scheduler.py:5518``).
- ``Engine.release_memory_occupation(tags=[...])`` / ``resume_memory_occupation(tags=[...])``
  (``engine.py:1831``, ``:1837``), tags ``"weights"``, ``"kv_cache"``, ``"cuda_graph"``
  (``srt/constants.py:2-4``; ``None`` means all, ``weight_updater.py:345``; resuming a tag that
  was not released fails, so the released set is tracked here).
- ``Engine.shutdown()`` (``engine.py:1450``) in :meth:`SGLangRollout.close`, only where every
  child of the process is SGLang's (it kills them all, ``engine.py:1491``); otherwise SGLang's
  own processes (``Engine.get_all_child_pids``, ``engine.py:398``) are stopped by pid. SGLang's
  SIGTERM handler (added on the first request in the main thread,
  ``tokenizer_manager.py:2451-2455``) is taken off again: the worker's own stays.

No SGLang engine has run this code: the CI machines have no GPU, and SGLang's CPU engine needs a
from-source CPU build of sgl-kernel (tried 2026-12-04 with 0.5.23 and ``SGLANG_USE_CPU_ENGINE=1``:
it stops at ``from sgl_kernel import copy_all_layer_kv_cache_cpu``,
``kernels/ops/kvcache/cache_move.py:10``; the package index's sglang-kernel 0.4.10 is CUDA-only).
What is tested on CPU is everything around the engine: the translation functions against
outputs of SGLang's exact shape, the server arguments, the weight buckets, Config validation and
the one-line errors where SGLang or a GPU is missing. ``scripts/gpu_check.sh`` runs the engine
path (generate, weight update, sleep/wake) where SGLang and a GPU exist.

Memory: :meth:`sleep` releases everything (weights, KV cache, CUDA graphs); :meth:`wake_up`
restores the weights only, so a weight sync runs before the KV cache is back (verl's order);
generation restores the rest.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import attrs
import torch

from rlcore.engine import dtype_from_name, position_ids_from_mask
from rlcore.errors import ConfigError, RlcoreError
from rlcore.interfaces import (
    BaseRollout,
    GenerationResult,
    RolloutSpec,
    SamplingParams,
    key,
    seconds,
)
from rlcore.protocol import DataProto
from rlcore_sglang.model_info import special_token_ids
from rlcore_sglang.processes import LOOP_WAIT_S, child_pids, keep_sigterm, stop_trees
from rlcore_sglang.translate import (
    SGLANG_VERSION,
    Completion,
    batch_tensors,
    bucket_named_tensors,
    completion_from_output,
    prompt_token_lists,
    request_seed,
    sampling_params_dict,
)

log = logging.getLogger(__name__)

__all__ = [
    "MANAGED_SERVER_ARGS",
    "SGLangRollout",
    "WeightSyncError",
    "missing_here",
    "missing_requirement",
    "special_token_ids",
]

_ALL_TAGS = ("weights", "kv_cache", "cuda_graph")  # srt/constants.py:2-4
INSTALL_HINT = (
    f"pip install 'rlcore-sglang[engine]' (SGLang {SGLANG_VERSION}; it needs a CUDA GPU and "
    'brings its own CUDA torch); on a CPU machine use [rollout] name = "hf"'
)
# ServerArgs that rlcore sets from the run; [rollout].server_args may not override them.
MANAGED_SERVER_ARGS = {
    "model_path": "model.path",
    "tokenizer_path": "model.path",
    "dtype": "model.dtype",
    "trust_remote_code": "model.trust_remote_code",
    "tp_size": "rollout.tensor_parallel_size",
    "mem_fraction_static": "rollout.gpu_memory_utilization",
    "enable_memory_saver": "rollout.enable_memory_saver",
    "enable_deterministic_inference": "rollout.deterministic",
    "random_seed": "trainer.seed",
    "base_gpu_id": "rollout.base_gpu_id",
    "log_level": "rollout.log_level",
}


class WeightSyncError(RlcoreError):
    """SGLang refused a weight update (unknown name, wrong shape, cache not flushed)."""


def missing_requirement(
    *, sglang_installed: bool, device: str, visible_gpus: int, tensor_parallel_size: int
) -> str | None:
    """What a machine lacks to run the ``sglang`` rollout, as one line; None if nothing."""
    if not sglang_installed:
        return f"rollout 'sglang' needs SGLang, which is not installed: {INSTALL_HINT}"
    if device != "cuda":
        return (
            f"rollout 'sglang' needs a CUDA GPU but [resources] device = {device!r}; set "
            'device = "cuda", or use [rollout] name = "hf" on CPU'
        )
    if visible_gpus < tensor_parallel_size:
        return (
            f"rollout 'sglang' needs {tensor_parallel_size} CUDA GPU(s) "
            f"(rollout.tensor_parallel_size) in this process, torch sees {visible_gpus}"
        )
    return None


def missing_here(device: str, tensor_parallel_size: int) -> str | None:
    """:func:`missing_requirement` for this process (SGLang importable? GPUs torch sees)."""
    return missing_requirement(
        sglang_installed=importlib.util.find_spec("sglang") is not None,
        device=device,
        visible_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        tensor_parallel_size=tensor_parallel_size,
    )


class SGLangRollout(BaseRollout):
    """A :class:`~rlcore.interfaces.BaseRollout` on ``sglang.Engine``: one response per row.

    Extra public surface: ``engine`` (the SGLang Engine), ``eos_token_ids``, ``pad_token_id``,
    :meth:`close`.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseRollout.Config):
        """Options of ``[rollout]`` for ``name = "sglang"`` (verl's names where it has one)."""

        # One rollout per tensor-parallel group.
        tensor_parallel_size: int = key(
            1,
            "GPUs one SGLang engine spans (ServerArgs.tp_size); the worker process "
            "must see that many.",
            validator=attrs.validators.ge(1),
        )
        gpu_memory_utilization: float = key(
            0.5,
            "Share of GPU memory for weights and KV cache (ServerArgs.mem_fraction_static).",
            validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],
        )
        enable_memory_saver: bool = key(
            True,
            "sleep()/wake_up() free and restore GPU memory (SGLang's memory saver); "
            "false: they do nothing.",
        )
        deterministic: bool = key(
            False,
            "Batch-invariant kernels and per-request seeds: reruns and resumes sample identically.",
        )
        update_weights_bucket_mb: int = key(
            512,
            "Weight sync sends tensors to SGLang in buckets of this many MiB.",
            validator=attrs.validators.ge(1),
        )
        # generate_one too.
        request_timeout_s: float = key(
            3600.0,
            "Time limit of one generate call on SGLang (s).",
            validator=seconds(holder="asyncio.wait_for"),
        )
        base_gpu_id: int | None = key(
            None,
            "First GPU of the engine; unset: torch's current device in this process.",
            validator=attrs.validators.optional(attrs.validators.ge(0)),
        )
        log_level: str = key(
            "error",
            "SGLang's log level.",
            validator=attrs.validators.in_(("debug", "info", "warning", "error", "critical")),
        )
        server_args: dict[str, Any] = key(
            factory=dict,
            help="Any other ServerArgs field, passed through (verl's "
            "engine_kwargs.sglang); keys rlcore sets are refused.",
        )

        @server_args.validator
        def _check_server_args(self, attribute: Any, value: dict[str, Any]) -> None:
            clash = sorted(set(value) & set(MANAGED_SERVER_ARGS))
            if clash:
                keys = ", ".join(f"{k} (set from {MANAGED_SERVER_ARGS[k]})" for k in clash)
                msg = f"keys set by rlcore cannot be overridden here: {keys}"
                raise ValueError(msg)

    def __init__(self, spec: RolloutSpec, config: SGLangRollout.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: SGLangRollout.Config
        missing = missing_here(spec.device, self.config.tensor_parallel_size)
        if missing is not None:
            raise ConfigError(missing)
        import sglang

        self.eos_token_ids, self.pad_token_id = special_token_ids(spec)
        gpu = self.config.base_gpu_id
        self.device = torch.device("cuda", torch.cuda.current_device() if gpu is None else gpu)
        kwargs = self.server_kwargs(spec, self.config, base_gpu_id=self.device.index or 0)
        _check_server_arg_names(self.config.server_args, sglang.__version__)
        self._init_state()
        before = child_pids()
        self.engine = sglang.Engine(**kwargs)
        self._sglang_pids = child_pids() - before

    def _init_state(self) -> None:
        """Bookkeeping set before the engine exists (tests build the rollout around a
        stand-in engine through this)."""
        self._calls = 0
        self._released: set[str] = set()
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._resume_lock = threading.Lock()
        self._sglang_pids: set[int] = set()  # children that appeared while SGLang started

    @staticmethod
    def server_kwargs(
        spec: RolloutSpec, config: SGLangRollout.Config, *, base_gpu_id: int
    ) -> dict[str, Any]:
        """The ``ServerArgs`` keyword arguments for this run (pure; tested on CPU)."""
        return {
            **config.server_args,
            "model_path": spec.model_path,
            "tokenizer_path": spec.model_path,
            "dtype": spec.dtype,
            "trust_remote_code": spec.trust_remote_code,
            "tp_size": config.tensor_parallel_size,
            "mem_fraction_static": config.gpu_memory_utilization,
            "enable_memory_saver": config.enable_memory_saver,
            "enable_deterministic_inference": config.deterministic,
            "random_seed": spec.seed,
            "base_gpu_id": base_gpu_id,
            "log_level": config.log_level,
            # The Engine path applies no model-recommended sampling; say so explicitly.
            "sampling_defaults": config.server_args.get("sampling_defaults", "openai"),
        }

    # --- generation -----------------------------------------------------------------------

    def _request_params(
        self, sampling: SamplingParams, rows: int, call: int
    ) -> dict[str, Any] | list[dict[str, Any]]:
        if not self.config.deterministic or sampling.greedy:
            return sampling_params_dict(sampling, stop_token_ids=self.eos_token_ids)
        return [
            sampling_params_dict(
                sampling,
                stop_token_ids=self.eos_token_ids,
                seed=request_seed(self.spec.seed, call, row),
            )
            for row in range(rows)
        ]

    def _run(self, coro: Any, what: str) -> Any:
        self._park_loop()
        loop = getattr(self.engine, "loop", None) or asyncio.get_event_loop()
        try:
            with keep_sigterm(loop):
                return loop.run_until_complete(
                    asyncio.wait_for(coro, timeout=self.config.request_timeout_s)
                )
        except TimeoutError as err:
            msg = (
                f"SGLang did not answer {what} within rollout.request_timeout_s="
                f"{self.config.request_timeout_s:g} s"
            )
            raise RlcoreError(msg) from err

    # --- SGLang's event loop ----------------------------------------------------------------
    # SGLang's tokenizer manager binds its output-handling task to the loop of the first
    # request (``auto_create_handle_loop``, managers/tokenizer_manager.py:2440-2449, called by
    # ``generate_request`` at :900) and answers requests only while that loop runs. The Engine's
    # loop (``Engine.loop``, entrypoints/engine.py:396, from ``_ensure_event_loop`` at
    # :1404-1414) runs only inside the Engine's own sync calls (``loop.run_until_complete``,
    # e.g. :1507, :1833, :1839). So every request goes to ``Engine.loop``: the batch path runs
    # it with ``run_until_complete``; ``generate_one`` awaited on another loop (the agent
    # loop's, rlcore/agent/loop.py) hands the request to it with ``run_coroutine_threadsafe``
    # while a thread of ours runs it (:meth:`_serve_loop`), and every sync call parks that
    # thread first (:meth:`_park_loop`), since ``run_until_complete`` refuses a running loop.

    def _serve_loop(self) -> asyncio.AbstractEventLoop:
        """Run ``Engine.loop`` in a thread of ours (idempotent); return it once it runs."""
        loop: asyncio.AbstractEventLoop = self.engine.loop
        with self._loop_lock:
            if self._loop_thread is None:

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.run_forever()

                thread = threading.Thread(target=serve, name="rlcore-sglang-loop", daemon=True)
                thread.start()
                self._loop_thread = thread
            deadline = time.monotonic() + LOOP_WAIT_S
            while not loop.is_running():
                if time.monotonic() > deadline or not self._loop_thread.is_alive():
                    msg = f"SGLang's event loop did not start in a thread within {LOOP_WAIT_S} s"
                    raise RlcoreError(msg)
                time.sleep(0.001)
        return loop

    def _park_loop(self) -> None:
        """Stop the thread of :meth:`_serve_loop`, if any, so sync Engine calls can run."""
        with self._loop_lock:
            thread, self._loop_thread = self._loop_thread, None
            if thread is None:
                return
            self.engine.loop.call_soon_threadsafe(self.engine.loop.stop)
            thread.join(LOOP_WAIT_S)
            if thread.is_alive():
                msg = f"SGLang's event loop did not stop within {LOOP_WAIT_S} s"
                raise RlcoreError(msg)

    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """One response per row (see :class:`BaseRollout` for the layout)."""
        self._resume(_ALL_TAGS)
        input_ids = prompts.batch["input_ids"]  # (B, P), left-padded
        attention_mask = prompts.batch["attention_mask"]
        position_ids = prompts.batch.get("position_ids")
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        call = self._calls
        self._calls += 1
        rows = prompt_token_lists(input_ids.cpu(), attention_mask.cpu())
        outputs = self._run(
            self.engine.async_generate(
                input_ids=rows,
                sampling_params=self._request_params(sampling, len(rows), call),
                return_logprob=sampling.return_log_probs,
            ),
            f"generate ({len(rows)} requests)",
        )
        if isinstance(outputs, dict):  # SGLang answers a single request with one dict
            outputs = [outputs]
        completions = [
            completion_from_output(
                out,
                row=i,
                max_new_tokens=sampling.max_new_tokens,
                with_log_probs=sampling.return_log_probs,
            )
            for i, out in enumerate(outputs)
        ]
        tensors = batch_tensors(
            completions,
            prompt_ids=input_ids.cpu(),
            prompt_mask=attention_mask.cpu(),
            prompt_pos=position_ids.cpu(),
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_token_id,
            eos_token_ids=self.eos_token_ids,
            with_log_probs=sampling.return_log_probs,
        )
        return DataProto.from_dict(tensors=tensors)

    async def generate_one(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> GenerationResult:
        """One request (agent loops): ``GenerationResult(token_ids, log_probs, finish_reason)``.

        Awaitable on any event loop (the agent loop runs its own): the request itself always
        runs on SGLang's loop, ``rollout.engine.loop`` (see :meth:`_serve_loop`). Concurrent
        calls are batched by SGLang.
        """
        engine_loop = self.engine.loop
        on_engine_loop = asyncio.get_running_loop() is engine_loop
        if not on_engine_loop and self._released:
            # Sync Engine calls cannot run under a running loop: from a thread of their own.
            await asyncio.to_thread(self._resume, _ALL_TAGS)
        call = self._calls
        self._calls += 1
        seed = request_seed(self.spec.seed, call, 0) if self.config.deterministic else None
        request = self.engine.async_generate(
            input_ids=list(prompt_ids),
            sampling_params=sampling_params_dict(
                sampling, stop_token_ids=self.eos_token_ids, seed=seed
            ),
            return_logprob=sampling.return_log_probs,
        )
        try:
            if on_engine_loop:
                out = await asyncio.wait_for(request, timeout=self.config.request_timeout_s)
            else:
                future = asyncio.run_coroutine_threadsafe(request, self._serve_loop())
                try:
                    out = await asyncio.wait_for(
                        asyncio.wrap_future(future), timeout=self.config.request_timeout_s
                    )
                finally:
                    future.cancel()  # a timeout or a cancelled conversation: drop the request
        except TimeoutError as err:
            msg = (
                "SGLang did not answer generate_one within rollout.request_timeout_s="
                f"{self.config.request_timeout_s:g} s"
            )
            raise RlcoreError(msg) from err
        done = completion_from_output(
            out,
            row=0,
            max_new_tokens=sampling.max_new_tokens,
            with_log_probs=sampling.return_log_probs,
        )
        return _generation_result(done)

    # --- weights and memory ---------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        # Per-request seeds derive from spec.seed + the call counter: resuming needs it.
        return {"calls": self._calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._calls = int(state.get("calls", 0))

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send the streamed (HF name, full tensor) pairs to SGLang in buckets, then flush
        the prefix cache once (its entries were computed with the old weights)."""
        self._park_loop()
        self._resume(("weights",))
        dtype = dtype_from_name(self.spec.dtype)
        bucket_bytes = self.config.update_weights_bucket_mb << 20

        def on_device() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                # Cast floats to the rollout dtype before the copy: fewer bytes over IPC.
                target = dtype if tensor.is_floating_point() else tensor.dtype
                yield name, tensor.detach().to(self.device, target).contiguous()

        with keep_sigterm(self.engine.loop):
            begin = getattr(self.engine, "begin_weight_update", None)
            if begin is not None:
                _check(begin(), "begin_weight_update")
            sent = 0
            try:
                for bucket in bucket_named_tensors(on_device(), bucket_bytes):
                    result = self.engine.update_weights_from_tensor(
                        named_tensors=bucket, flush_cache=False
                    )
                    _check(result, f"update_weights_from_tensor ({bucket[0][0]!r} ...)")
                    sent += len(bucket)
            finally:
                end = getattr(self.engine, "end_weight_update", None)
                if begin is not None and end is not None:
                    _check(end(), "end_weight_update")
            _check(self.engine.flush_cache(), "flush_cache after the weight update")
        log.debug("weight sync: %d tensors sent to SGLang", sent)

    def sleep(self) -> None:
        """Release SGLang's GPU memory (weights, KV cache, CUDA graphs) while training runs."""
        if not self.config.enable_memory_saver:
            return
        self._park_loop()
        awake = [t for t in _ALL_TAGS if t not in self._released]
        if awake:
            with keep_sigterm(self.engine.loop):
                self.engine.release_memory_occupation(tags=awake)
            self._released.update(awake)

    def wake_up(self) -> None:
        """Restore the weights (the KV cache comes back at the next generation)."""
        self._resume(("weights",))

    def _resume(self, tags: Iterable[str]) -> None:
        # Resuming a tag SGLang did not release fails in its scheduler: send only released ones.
        with self._resume_lock:  # concurrent generate_one calls resume once
            wanted = [t for t in tags if t in self._released]
            if wanted:
                self._park_loop()
                with keep_sigterm(self.engine.loop):
                    self.engine.resume_memory_occupation(tags=wanted)
                self._released.difference_update(wanted)

    def close(self) -> None:
        """Stop SGLang's scheduler and detokenizer processes, and no other child of ours.

        ``Engine.shutdown`` ends with ``kill_process_tree(os.getpid(), include_parent=False)``
        (entrypoints/engine.py:1491): SIGKILL to every descendant of this process, SGLang's or
        not (utils/common.py:2533-2543). It is called only where every child of this process is
        SGLang's; otherwise SGLang's own processes (``Engine.get_all_child_pids``,
        engine.py:398, and the children that appeared while the engine started) get SIGTERM,
        then SIGKILL after a bounded wait, and the rest are left alone.
        """
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        self._park_loop()
        self.engine = None
        ours = set(self._sglang_pids)
        get_pids = getattr(engine, "get_all_child_pids", None)
        if get_pids is not None:
            ours.update(int(p) for p in get_pids())
        others = child_pids() - ours
        if not others:
            engine.shutdown()
            return
        log.info(
            "SGLang shutdown: stopping its processes %s only (other children: %s)",
            sorted(ours),
            sorted(others),
        )
        stop_trees(ours, timeout_s=LOOP_WAIT_S)


# --- helpers ------------------------------------------------------------------------------


def _check(result: Any, what: str) -> None:
    """SGLang control calls answer (success, message) or an object with ``.success``."""
    if result is None:
        return
    if isinstance(result, tuple) and len(result) >= 2:
        success, message = bool(result[0]), str(result[1])
    else:
        success = bool(getattr(result, "success", True))
        message = str(getattr(result, "message", ""))
    if not success:
        msg = f"[rollout] SGLang {what} failed: {message}"
        raise WeightSyncError(msg)


def _check_server_arg_names(extra: dict[str, Any], version: str) -> None:
    """Unknown [rollout].server_args keys, named before SGLang starts its processes."""
    from sglang.srt.server_args import ServerArgs  # a msgspec Struct (server_args.py:551)

    unknown = sorted(set(extra) - set(ServerArgs.__struct_fields__))
    if unknown:
        msg = "; ".join(
            f"rollout.server_args.{k}: not a ServerArgs field of SGLang {version}" for k in unknown
        )
        raise ConfigError(msg)


def _generation_result(done: Completion) -> GenerationResult:
    return GenerationResult(
        token_ids=done.token_ids, log_probs=done.log_probs, finish_reason=done.finish_reason
    )
