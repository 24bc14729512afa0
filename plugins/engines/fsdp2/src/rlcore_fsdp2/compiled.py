"""The compiled update (``actor.compile``, ``critic.compile``): bucketed shapes, one compile each.

``torch.compile(model, dynamic=False)`` specialises a graph to its input shapes, and a
micro-batch's shape changes every batch (its longest prompt and response). So the update
pads each micro-batch, in the padded (b, P+R) layout, to a bucket:

- prompt columns (after dropping columns that are padding in every row) and response columns
  each round up to a power of two >= 16, capped at ``max_prompt_length`` /
  ``max_response_length`` (the cap is a bucket of its own: 64 and 24 give {16, 32, 64} and
  {16, 24});
- rows: ``micro_batch_size`` (the last, shorter micro-batch is filled up), or, with a token
  budget, the next power of two.

Left padding goes before the prompt, right padding after the response, so every real token
keeps its position and attends to the same keys. Filler rows are copies of the first row whose
outputs are dropped: they see real tokens (no fully masked attention row) and add an exact zero
to the gradient. The shapes, and so the compiles, are at most
``|prompt buckets| x |response buckets| x |row buckets|`` (:func:`shape_bound`); Dynamo's
recompile limit is raised to that bound. Only the update is compiled: the log-prob passes (no
gradient, eval mode) stay eager.

Cost and break-even: the first :data:`EAGER_PASSES` micro-batches of each new shape run eager
(the engine's own forward, packed by default); the last one's pass time (forward, loss and
backward, until the next pass starts) is the eager reference, the first being a warm-up (a
process's first backward allocates). The next pass at that shape compiles; its time minus the
eager pass is the compile cost, reported once as ``perf/compile_s/<role>`` and logged. When a
compiled pass at that shape has run, the per-pass saving is known and the break-even is logged
(and reported as ``perf/compile_break_even_steps/<role>``): compile cost / (saving per pass x
passes per optimizer step). The eager passes run per shape are part of the engine's
checkpoint, so a resumed run compiles where the uninterrupted one would: bit-identical resume
holds within one mode.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from rlcore.interfaces import EngineSpec, ModelOutputs
from rlcore.protocol import DataProto
from rlcore_fsdp2.batching import trim_left_padding
from rlcore_fsdp2.forward import Scoring, token_outputs
from rlcore_fsdp2.logprob import response_logits

log = logging.getLogger(__name__)

SMALLEST = 16  # the smallest length bucket
EAGER_PASSES = 2  # eager passes at a new shape before it compiles; the last is the reference
Shape = tuple[int, int, int]  # (rows, prompt columns, response columns)


def bucket(n: int, cap: int | None) -> int:
    """``n`` rounded up to a power of two >= :data:`SMALLEST`, at most ``cap`` when
    ``n <= cap`` (the cap is a bucket of its own); None: no cap."""
    rounded = max(SMALLEST, 1 << max(0, n - 1).bit_length())
    return min(rounded, cap) if cap is not None and n <= cap else rounded


def bucket_count(cap: int | None) -> int:
    """How many buckets lengths up to ``cap`` fall in (:func:`bucket`); None: 1 (unknown)."""
    if cap is None:
        return 1
    return len({bucket(n, cap) for n in range(1, cap + 1)})


def shape_bound(spec: EngineSpec) -> int:
    """The most distinct shapes (so compiles) an update of ``spec`` pads micro-batches to."""
    rows = 1
    if spec.micro_batch_size is None and spec.max_tokens_per_micro_batch is not None:
        rows = (max(1, spec.max_tokens_per_micro_batch) - 1).bit_length() + 1  # 1, 2, 4, ..
    return rows * bucket_count(spec.max_prompt_length) * bucket_count(spec.max_response_length)


@attrs.frozen(kw_only=True)
class Padded:
    """A micro-batch at its bucket shape; ``rows``/``response_length``: the real part."""

    input_ids: torch.Tensor  # (rows_b, P_b + R_b)
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor  # (rows_b, R_b)
    rows: int
    response_length: int

    @property
    def shape(self) -> Shape:
        b, r = self.responses.shape
        return b, self.input_ids.shape[1] - r, r


def pad_to_bucket(mb: DataProto, spec: EngineSpec, device: torch.device) -> Padded:
    """``mb``'s (b, P+R) tensors placed in a (rows_b, P_b+R_b) bucket (module docstring)."""
    batch = mb.batch
    ids, mask, pos = trim_left_padding(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    )
    responses = batch["responses"]
    b, t = ids.shape
    r = responses.shape[1]
    p = t - r
    rows_b = spec.micro_batch_size or max(1, 1 << (b - 1).bit_length())
    rows_b = max(rows_b, b)
    p_b, r_b = bucket(p, spec.max_prompt_length), bucket(r, spec.max_response_length)

    def place(x: torch.Tensor, width: int, offset: int) -> torch.Tensor:
        out = x.new_zeros(rows_b, width)
        out[:b, offset : offset + x.shape[1]] = x
        out[b:] = out[0]  # filler rows: copies of a real row, outputs dropped
        return out.to(device)

    return Padded(
        input_ids=place(ids, p_b + r_b, p_b - p),
        attention_mask=place(mask, p_b + r_b, p_b - p),
        position_ids=place(pos, p_b + r_b, p_b - p),
        responses=place(responses, r_b, 0),
        rows=b,
        response_length=r,
    )


def padded_outputs(model: Callable[..., Any], padded: Padded, scoring: Scoring) -> ModelOutputs:
    """``model`` on the bucket; outputs cut back to the real (b, R)."""
    b, r = padded.rows, padded.response_length
    r_b = padded.responses.shape[1]
    kwargs: dict[str, Any] = {
        "input_ids": padded.input_ids,
        "attention_mask": padded.attention_mask,
        "position_ids": padded.position_ids,
        "use_cache": False,
    }
    if scoring.value_head:
        out = model(**kwargs)
        # The value of the state before response token j sits at position P_b-1+j.
        return ModelOutputs(values=out.logits[:b, -(r_b + 1) : -1, 0][:, :r].float())
    out = model(**kwargs, logits_to_keep=r_b + 1)
    full = token_outputs(response_logits(out.logits, r_b), padded.responses, scoring)
    assert full.log_probs is not None
    entropy = full.entropy[:b, :r] if full.entropy is not None else None
    return ModelOutputs(log_probs=full.log_probs[:b, :r], entropy=entropy)


@attrs.define
class _ShapeTimes:
    eager_s: float | None = None  # the last eager pass at this shape
    compile_s: float | None = None  # the compiling pass minus the eager pass
    compiled_s: list[float] = attrs.Factory(list)  # later compiled passes
    reported: bool = False  # the break-even was logged


class CompiledUpdate:
    """The engine's compiled update: bucketing, the compiled model, its timings.

    ``forward(mb, eager, scoring)`` is the micro-batch forward ``accumulate_gradients`` calls;
    ``eager`` is the engine's own forward, used for the first pass of a shape.
    :meth:`finish` ends a ``forward_backward`` call and returns its metrics.
    """

    def __init__(self, model: torch.nn.Module, spec: EngineSpec, device: torch.device) -> None:
        import torch._dynamo.config as dynamo_config

        self.spec, self.device = spec, device
        self.bound = shape_bound(spec)
        # One graph per bucket shape; Dynamo's defaults (8 per frame) would fall back to eager.
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, self.bound)
        dynamo_config.accumulated_recompile_limit = max(
            dynamo_config.accumulated_recompile_limit, self.bound
        )
        self.model = torch.compile(model, dynamic=False)
        self.eager: dict[Shape, int] = {}  # eager passes run per shape (EAGER_PASSES: compile)
        self._times: dict[Shape, _ShapeTimes] = {}
        self._open: tuple[Shape, str, float] | None = None  # the pass being timed
        self._passes = 0  # passes since the last optimizer step
        self._per_step = 1  # passes of the last optimizer step
        self._metrics: dict[str, float] = {}
        log.info("%s: compiled update on; at most %d shapes (so compiles)", spec.role, self.bound)

    def forward(
        self, mb: DataProto, eager: Callable[[DataProto], ModelOutputs], scoring: Scoring
    ) -> ModelOutputs:
        self._close()  # the previous pass ends here: its result decides this one's mode
        padded = pad_to_bucket(mb, self.spec, self.device)
        shape = padded.shape
        times = self._times.setdefault(shape, _ShapeTimes())
        if self.eager.get(shape, 0) < EAGER_PASSES:
            self.eager[shape] = self.eager.get(shape, 0) + 1
            self._begin(shape, "eager")
            return eager(mb)
        self._begin(shape, "compile" if times.compile_s is None else "run")
        return padded_outputs(self.model, padded, scoring)

    def _begin(self, shape: Shape, mode: str) -> None:
        self._passes += 1
        self._open = (shape, mode, time.perf_counter())

    def _close(self) -> None:
        if self._open is None:
            return
        shape, mode, start = self._open
        self._open = None
        seconds = time.perf_counter() - start
        times = self._times[shape]
        if mode == "eager":
            times.eager_s = seconds
        elif mode == "compile":
            # Minus the eager pass's work; resumed (no eager pass ran): the whole pass.
            times.compile_s = max(0.0, seconds - (times.eager_s or 0.0))
            key = f"perf/compile_s/{self.spec.role}"
            self._metrics[key] = self._metrics.get(key, 0.0) + times.compile_s
            log.warning(
                "%s: compiled the update for shape rows x prompt x response = %s in %.1f s "
                "(%d of at most %d shapes)",
                self.spec.role,
                "x".join(map(str, shape)),
                times.compile_s,
                sum(t.compile_s is not None for t in self._times.values()),
                self.bound,
            )
        elif mode == "run":
            times.compiled_s.append(seconds)
            self._report_break_even(shape, times)

    def _report_break_even(self, shape: Shape, times: _ShapeTimes) -> None:
        if times.reported or times.eager_s is None or times.compile_s is None:
            return
        times.reported = True
        compiled = statistics.median(times.compiled_s)
        saving = times.eager_s - compiled  # per pass
        shape_text = "x".join(map(str, shape))
        if saving <= 0:  # no break-even to report: a line saying so, no metric
            log.warning(
                "%s: at shape %s the compiled pass (%.3f s) is not faster than eager (%.3f s): "
                "the %.1f s compile never pays back; consider %s.compile = false",
                self.spec.role,
                shape_text,
                compiled,
                times.eager_s,
                times.compile_s,
                self.spec.role,
            )
            return
        steps = times.compile_s / (saving * self._per_step)
        log.warning(
            "%s: compiled pass %.3f s vs eager %.3f s at shape %s (%.2fx): the %.1f s "
            "compile pays back after %.0f optimizer steps (%d passes each)",
            self.spec.role,
            compiled,
            times.eager_s,
            shape_text,
            times.eager_s / compiled,
            times.compile_s,
            steps,
            self._per_step,
        )
        self._metrics[f"perf/compile_break_even_steps/{self.spec.role}"] = steps

    def finish(self) -> dict[str, float]:
        """End of a ``forward_backward``: close the last pass; this call's compile metrics."""
        self._close()
        metrics, self._metrics = self._metrics, {}
        return metrics

    def stepped(self) -> None:
        """An optimizer step: the passes since the last one are a step's."""
        self._per_step = max(1, self._passes)
        self._passes = 0

    # --- checkpoint: the eager passes run per shape ---------------------------------------

    def state_dict(self) -> list[list[int]]:
        """``[rows, prompt, response, eager passes]`` per shape (plain ints: weights_only)."""
        return [[*shape, count] for shape, count in sorted(self.eager.items())]

    def load_state_dict(self, rows: list[list[int]]) -> None:
        self.eager = {(int(r[0]), int(r[1]), int(r[2])): int(r[3]) for r in rows}
