"""vLLM's async engine (``vllm.v1.engine.async_llm.AsyncLLM``) behind the calls the rollout makes.

``AsyncLLM`` streams each request's outputs from one background task (its output handler)
bound to the event loop that first used it. The rollout is called from several loops: the
agent loop makes a new one per batch, the worker's batch ``generate`` and weight sync have
none. So the engine lives on its own loop in a daemon thread (:class:`AsyncEngine`), and
every call is handed to that loop: synchronous ones (``generate`` of a batch, weight sync,
sleep/wake) wait on the result with a bound; :meth:`AsyncEngine.generate_one` is awaited from
the caller's loop, so many conversations are in the engine's continuous batch at once.

A caller that stops waiting (``asyncio.wait_for`` of the agent loop) cancels its request:
the cancellation crosses to the engine loop, where ``AsyncLLM.generate`` aborts the request
and frees its KV cache.

``AsyncLLM`` always runs EngineCore in a subprocess (``AsyncMPClient``): weights cross by CUDA
IPC handle on a GPU (:mod:`rlcore_vllm.cuda_ipc`) or as files (:mod:`rlcore_vllm.weights`), as
in the multiprocess ``vllm.LLM``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from rlcore.errors import RlcoreError
from rlcore_vllm.partial import Continued, Segments

__all__ = ["AsyncEngine", "EngineTimeout"]

T = TypeVar("T")


class EngineTimeout(RlcoreError):
    """A call to the vLLM engine did not finish within its bound."""


class AsyncEngine:
    """``AsyncLLM`` on a private event loop, with the face of ``vllm.LLM`` the rollout uses.

    ``engine_kwargs``: ``AsyncEngineArgs`` fields (the rollout's ``_engine_kwargs``);
    ``timeout_s``: the bound of every call (engine start, a batch, one request, an RPC).
    """

    def __init__(self, engine_kwargs: dict[str, Any], *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rlcore-vllm-async-engine", daemon=True
        )
        self._thread.start()
        try:
            self.engine = self._wait(self._start(engine_kwargs), "the async engine to start")
        except BaseException:
            self._stop_loop()
            raise
        self.segments = Segments(self.engine)  # partial rollouts (rlcore_vllm.partial)

    async def _start(self, engine_kwargs: dict[str, Any]) -> Any:
        # Built on its own loop: the client's sockets and the output handler belong to it.
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_kwargs, disable_log_stats=True)
        return AsyncLLM.from_engine_args(args)

    # --- calls from any thread ------------------------------------------------------------

    def _wait(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            msg = (
                f"[rollout] vLLM: waited {self.timeout_s} s for {what}; raise [rollout] "
                "request_timeout_s if the engine is just slow"
            )
            raise EngineTimeout(msg) from None

    async def _final(
        self, prompt_ids: Sequence[int], params: Any, request_id: str, lora_request: Any
    ) -> Any:
        from vllm.inputs import TokensPrompt

        final = None
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        stream = self.engine.generate(prompt, params, request_id, lora_request=lora_request)
        async for out in stream:
            final = out  # FINAL_ONLY: one output, the finished request
        if final is None:
            msg = f"vLLM returned no output for request {request_id}"
            raise RuntimeError(msg)
        return final

    def _request_id(self) -> str:
        return f"rlcore-{next(self._ids)}"

    def generate(
        self,
        prompts: Sequence[Any],
        params: Any,
        use_tqdm: bool = False,
        lora_request: Any = None,
    ) -> list[Any]:
        """``vllm.LLM.generate`` for ``TokensPrompt`` rows: every row in flight at once."""
        del use_tqdm
        per_row = params if isinstance(params, list) else [params] * len(prompts)

        async def batch() -> list[Any]:
            return await asyncio.gather(
                *(
                    self._final(
                        p["prompt_token_ids"], _final_only(sp), self._request_id(), lora_request
                    )
                    for p, sp in zip(prompts, per_row)
                )
            )

        return self._wait(batch(), f"a batch of {len(prompts)} requests")

    def generate_partial(
        self, prompts: Sequence[Sequence[int]], params: Sequence[Any], lora_request: Any = None
    ) -> list[Continued]:
        """Like :meth:`generate` (token-id rows, one params each), every request continued
        across the weight syncs that interrupt it (:class:`~rlcore_vllm.partial.Segments`)."""

        async def batch() -> list[Continued]:
            return await asyncio.gather(
                *(
                    self.segments.run(p, _final_only(sp), self._request_id(), lora_request)
                    for p, sp in zip(prompts, params)
                )
            )

        return self._wait(batch(), f"a batch of {len(prompts)} requests")

    def pause(self) -> int:
        """Abort the requests in flight for a weight load; they wait for :meth:`resume`."""
        return self._wait(self.segments.pause(), "the requests in flight to abort")

    def resume(self, version: int) -> None:
        """Continue the aborted requests with the weights now loaded (``version``)."""
        self._wait(self.segments.resume(version), "the requests to resume")

    async def generate_one(
        self, prompt_ids: Sequence[int], params: Any, lora_request: Any = None
    ) -> Any:
        """One request, awaited from the caller's own event loop; the engine's output."""
        request_id = self._request_id()
        final = self._final(prompt_ids, _final_only(params), request_id, lora_request)
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(final, self.timeout_s),
            self._loop,
        )  # fmt: skip
        try:
            return await asyncio.wrap_future(future)
        except TimeoutError:
            msg = f"[rollout] vLLM: request {request_id} ran past request_timeout_s="
            raise EngineTimeout(msg + f"{self.timeout_s}") from None

    def collective_rpc(
        self, method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        return self._wait(
            self.engine.collective_rpc(method, args=args, kwargs=kwargs),
            f"collective_rpc({method!r})",
        )

    def add_lora(self, lora_request: Any) -> bool:
        return bool(self._wait(self.engine.add_lora(lora_request), "a LoRA adapter to load"))

    def remove_lora(self, lora_id: int) -> bool:
        return bool(self._wait(self.engine.remove_lora(lora_id), "a LoRA adapter to unload"))

    def reset_prefix_cache(self) -> bool:
        return bool(self._wait(self.engine.reset_prefix_cache(), "reset_prefix_cache"))

    def sleep(self, level: int = 1) -> None:
        self._wait(self.engine.sleep(level), "sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._wait(self.engine.wake_up(tags), "wake_up")

    def shutdown(self) -> None:
        """Stop EngineCore (its subprocess) and the loop's thread."""
        engine, self.engine = self.engine, None
        self.segments.engine = None  # no reference left to keep AsyncLLM alive past this
        try:
            if engine is not None:
                # First the output handler: it would log EngineCore's exit as a crash.
                self._wait(_stop_output_handler(engine), "the output handler to stop")
                engine.shutdown()
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _stop_output_handler(engine: Any) -> None:
    handler = getattr(engine, "output_handler", None)
    if handler is not None and not handler.done():
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handler


def _final_only(params: Any) -> Any:
    """``params`` asking for the finished output only (no per-token streaming)."""
    from vllm.sampling_params import RequestOutputKind

    clone = params.clone()
    clone.output_kind = RequestOutputKind.FINAL_ONLY
    return clone
