"""A stand-in for ``sglang.Engine`` that enforces what SGLang 0.5.23 does, read from its source.

SGLang's CPU engine needs a from-source CPU build of sgl-kernel (no package index carries one;
the README says where 0.5.23 stops), so the plugin's engine path is driven on CPU through this
class. It is not a model: a response is a function of the prompt and of the weights SGLang
holds. What it enforces, each rule from the 0.5.23 wheel (paths under ``python/sglang/srt/``):

- One bound event loop. ``Engine.loop`` is made once (``entrypoints/engine.py:396``, by
  ``_ensure_event_loop`` at ``:1404-1414``); the tokenizer manager binds its output-handling
  task to the loop of the first request (``auto_create_handle_loop``,
  ``managers/tokenizer_manager.py:2440-2449``, from ``generate_request`` at ``:900``) and
  answers only while that loop runs. A request from another loop is refused here (SGLang would
  never answer it); a request on the bound loop completes only while that loop runs.
- The sync calls run ``self.loop.run_until_complete(...)`` (``engine.py:1507``, ``:1833``,
  ``:1839``, ``:1698``): they fail while the loop runs in another thread.
- The first request made in the main thread adds a SIGTERM handler to the bound loop
  (``tokenizer_manager.py:2451-2455``).
- ``update_weights_from_tensor`` fails outside ``begin_weight_update``/``end_weight_update``
  (``managers/scheduler_components/weight_updater.py:232-238``).
- ``release_memory_occupation(["weights"])`` drops the weights (the memory saver pauses them,
  ``weight_updater.py:368-374``, with no CPU copy unless ``enable_weights_cpu_backup``,
  ``model_executor/model_runner_components/load_model_utils.py:307``); resuming a tag that was
  not released fails (``offload_tags.remove``, ``weight_updater.py:389-390``); releasing needs
  an idle server (``weight_updater.py:343-345``). Generating with released weights or KV cache
  is refused here (on a GPU it reads freed memory).
- ``flush_cache`` is refused while requests run (``managers/scheduler.py:5516-5518``).
- ``shutdown`` kills every descendant of the calling process
  (``kill_process_tree(os.getpid(), include_parent=False)``, ``engine.py:1491``).
- Outputs have the shape of ``Engine.async_generate``'s (see ``test_translate.sglang_output``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import torch

ALL_TAGS = ("weights", "kv_cache", "cuda_graph")  # constants.py:2-4


class StandInEngine:
    """``sglang.Engine``'s surface as rlcore_sglang uses it; see the module docstring."""

    def __init__(self, weights: dict[str, torch.Tensor], *, eos: int, vocab: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.weights: dict[str, torch.Tensor] | None = {k: v.clone() for k, v in weights.items()}
        self.eos, self.vocab = eos, vocab
        self.bound: asyncio.AbstractEventLoop | None = None
        self.released: set[str] = set()
        self.session = False
        self.running = 0
        self.requests = 0
        self.sigterm_added = False
        self.children: list[subprocess.Popen[bytes]] = []
        self.would_kill: set[int] | None = None  # set by shutdown()

    # --- requests -------------------------------------------------------------------------

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self.bound is None:
            self.bound = loop
            if threading.current_thread() is threading.main_thread():
                loop.add_signal_handler(signal.SIGTERM, lambda: None)
                self.sigterm_added = True
        elif loop is not self.bound:
            msg = (
                "request from an event loop other than the one SGLang's tokenizer manager is "
                "bound to (tokenizer_manager.py:2440): it would never be answered"
            )
            raise RuntimeError(msg)

    def _answer(self, prompt: list[int], params: dict[str, Any], logprob: bool) -> dict[str, Any]:
        if self.released & {"weights", "kv_cache"} or self.weights is None:
            msg = f"generate with released memory {sorted(self.released)}"
            raise RuntimeError(msg)
        # A deterministic function of the prompt and the weights.
        key = float(sum(float(v.float().sum()) for v in self.weights.values()))
        base = (sum(prompt) + int(abs(key) * 1000)) % (self.vocab - 10) + 10
        n = int(params.get("max_new_tokens", 8))
        ids = [(base + i) % (self.vocab - 10) + 10 for i in range(max(n - 1, 0))]
        if n >= 3:
            ids = [*ids[:2], self.eos]
            reason: dict[str, Any] = {"type": "stop", "matched": self.eos}
        else:
            reason = {"type": "length", "length": len(ids)}
        meta: dict[str, Any] = {
            "id": f"r{self.requests}",
            "finish_reason": reason,
            "prompt_tokens": len(prompt),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
        }
        if logprob:
            meta["input_token_logprobs"] = [(None, prompt[0], None)]
            meta["output_token_logprobs"] = [(-0.5, t, None) for t in ids]
            meta["output_token_logprobs_length"] = len(ids)
        self.requests += 1
        return {"text": "", "output_ids": ids, "meta_info": meta}

    async def async_generate(
        self,
        input_ids: list[int] | list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]],
        return_logprob: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        self._bind()
        self.running += 1
        try:
            await asyncio.sleep(0.001)  # answered by the bound loop's handler: it must run
            if input_ids and isinstance(input_ids[0], list):
                rows: list[list[int]] = input_ids  # type: ignore[assignment]
                params = (
                    sampling_params
                    if isinstance(sampling_params, list)
                    else [sampling_params] * len(rows)
                )
                return [self._answer(r, p, return_logprob) for r, p in zip(rows, params)]
            assert isinstance(sampling_params, dict)
            return self._answer(list(input_ids), sampling_params, return_logprob)  # type: ignore[arg-type]
        finally:
            self.running -= 1

    # --- sync control calls (``self.loop.run_until_complete``, as SGLang's) ------------------

    def _sync(self, fn: Any) -> Any:
        async def call() -> Any:
            self._bind()
            return fn()

        return self.loop.run_until_complete(call())

    def begin_weight_update(self) -> tuple[bool, str]:
        def begin() -> tuple[bool, str]:
            self.session = True
            return True, "Success"

        return self._sync(begin)

    def end_weight_update(self) -> tuple[bool, str]:
        def end() -> tuple[bool, str]:
            self.session = False
            return True, "Success"

        return self._sync(end)

    def update_weights_from_tensor(
        self, named_tensors: list[tuple[str, torch.Tensor]], flush_cache: bool = True
    ) -> tuple[bool, str]:
        def update() -> tuple[bool, str]:
            if not self.session:
                return False, (
                    "update_weights_from_tensor must run between begin_weight_update() and "
                    "end_weight_update()"
                )
            if "weights" in self.released:
                return False, "weights are released"
            if self.weights is None:
                self.weights = {}
            for name, tensor in named_tensors:
                self.weights[name] = tensor.detach().clone()
            return True, "Success"

        return self._sync(update)

    def flush_cache(self) -> tuple[bool, str]:
        def flush() -> tuple[bool, str]:
            if self.running:
                return False, "Cache not flushed because there are pending requests."
            return True, ""

        return self._sync(flush)

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        def release() -> None:
            assert not self.running, "release_memory_occupation should be called when idle"
            for tag in tags or ALL_TAGS:
                self.released.add(tag)
                if tag == "weights":
                    self.weights = None  # no CPU backup: the content is gone

        return self._sync(release)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        def resume() -> None:
            for tag in tags or ALL_TAGS:
                self.released.remove(tag)  # KeyError for a tag that was not released
                if tag == "weights":
                    self.weights = {}  # memory back, content undefined until a sync

        return self._sync(resume)

    # --- processes ------------------------------------------------------------------------

    def start_child(self) -> subprocess.Popen[bytes]:
        """A process of SGLang's own (its scheduler, say)."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.children.append(child)
        return child

    def get_all_child_pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def shutdown(self) -> None:
        """Records what SGLang's blanket kill would hit; kills only this stand-in's children
        (killing the test process's other children, Ray's say, would wreck the session)."""
        import psutil

        self.would_kill = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
        for child in self.children:
            child.kill()
            child.wait(30)
