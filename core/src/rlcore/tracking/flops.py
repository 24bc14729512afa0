"""Model FLOPs counted from the model's shape, and model FLOPs utilisation (MFU) per step.

One count for the run's metrics and the benchmarks (``benchmarks/step_flops.py`` builds its
per-framework step counts on :class:`ModelShape`). For a decoder-only transformer, 2 FLOPs per
multiply-add:

- matmuls: every linear layer of every token (q, k, v, o, the MLP's three), and the LM head on
  the tokens whose logits are used (the response tokens);
- attention: QK^T and PV, 4 x query width x keys per token and layer (causal: a token at
  position t sees t + 1 keys);
- not counted: norms, activations, softmax, rotary embeddings, the optimizer, padding.

MFU counts *model* FLOPs, as verl's ``FlopsCounter`` and the PaLM paper do: the update is
3 x a forward over the batch's tokens (forward + backward), whatever recomputation
(gradient checkpointing) or saving (shared prompts, skipped rows) the engine does; generation
is one forward over every prompt and response token. The achieved rate is over the workers'
own compute time of the phase (``timing_s/worker/actor_forward_backward`` + ``_optimizer``,
``timing_s/worker/generate``; the slowest rank's), divided by the peak of all workers.
Because the count is of the model's work, not the engine's, an engine that does less (each
prompt run once for its group, skipped zero-advantage rows) can show MFU above 1: the
quickstart's 8-sample groups with shared prompts logged ``perf/mfu/update`` of about 1.4 against
the tiny model's measured matmul peak. Compare MFU across runs with the same levers.

The peak: on a GPU a declared dense bf16 figure for the card (``PEAK_TFLOPS``); on a CPU a
matmul of the model's own MLP shape measured once per machine, thread count and dtype
(:func:`measured_peak_flops`, cached under :func:`rlcore.cache.cache_dir` as JSON keyed by the
machine's signature), since a CPU's vendor peak is far from what eager kernels reach on it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.cache import cache_dir

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = [
    "PEAK_TFLOPS",
    "MfuMeter",
    "ModelShape",
    "causal_keys",
    "declared_peak_flops",
    "measured_peak_flops",
    "mfu_meter",
    "mfu_metrics",
    "step_model_flops",
]

# Dense bf16 tensor-core peaks (vendor data sheets, no sparsity), matched on the device name.
PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100": 989.0,  # SXM; the PCIe card is 756
    "A100": 312.0,
    "L40S": 362.0,
    "A10": 125.0,
    "B200": 2250.0,
}
# Rows of the measuring matmul: a micro-batch's worth of tokens, enough to reach the rate.
_PEAK_ROWS = 512


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a decoder's ``config.json``."""

    layers: int
    hidden: int
    q_width: int  # heads x head size
    kv_width: int  # key/value heads x head size
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, path: str | Path) -> ModelShape:
        """From a Hugging Face model folder (or its ``config.json``); Llama/Qwen2 key names."""
        path = Path(path)
        config = json.loads((path / "config.json" if path.is_dir() else path).read_text())
        return cls.from_dict(config)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelShape:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        head_size = config.get("head_dim") or hidden // heads
        kv_heads = config.get("num_key_value_heads") or heads
        return cls(
            layers=config["num_hidden_layers"],
            hidden=hidden,
            q_width=heads * head_size,
            kv_width=kv_heads * head_size,
            intermediate=config["intermediate_size"],
            vocab=config["vocab_size"],
        )

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's linear maps (q, k, v, o, gate, up, down)."""
        h = self.hidden
        attention = 2 * h * self.q_width + 2 * h * self.kv_width
        return attention + 3 * h * self.intermediate

    def forward(self, tokens: float, keys: float, head_tokens: float) -> float:
        """Forward FLOPs of ``tokens`` tokens that see ``keys`` keys in all (summed over the
        tokens, per layer), with the LM head on ``head_tokens`` of them."""
        decoder = self.layers * (2 * self.layer_params * tokens + 4 * self.q_width * keys)
        return decoder + 2 * self.hidden * self.vocab * head_tokens

    def decoder_forward(self, tokens: float, keys: float) -> float:
        """The decoder layers' part of :meth:`forward` (what checkpointing recomputes)."""
        return self.forward(tokens, keys, head_tokens=0)


def causal_keys(length: float, before: float = 0.0) -> float:
    """Keys seen in all by ``length`` tokens that follow ``before`` tokens, causally."""
    return length * before + length * (length + 1) / 2


def step_model_flops(shape: ModelShape, batch: DataProto) -> dict[str, float]:
    """Model FLOPs of the step's phases on ``batch``: ``update`` (forward + backward over
    every row) and ``generate`` (one forward over every row), from each row's prompt and
    response lengths (padding excluded). Empty when the batch has no masks."""
    tensors = batch.batch
    if "attention_mask" not in tensors or "responses" not in tensors:
        return {}
    response_len = tensors["responses"].shape[1]
    mask = tensors["attention_mask"]
    response = mask[:, -response_len:].sum(dim=1).double()
    total = mask.sum(dim=1).double()
    keys = float((total * (total + 1) / 2).sum().item())  # causal_keys of each row, summed
    forward = shape.forward(float(total.sum().item()), keys, float(response.sum().item()))
    return {"update": 3 * forward, "generate": forward}


def declared_peak_flops(device_name: str) -> float | None:
    """The data-sheet bf16 peak of a GPU named ``device_name``, or None if unknown."""
    for name, tflops in PEAK_TFLOPS.items():
        if name in device_name:
            return tflops * 1e12
    return None


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measured_peak_flops(shape: ModelShape, threads: int, dtype: str = "float32") -> float:
    """FLOP/s of one process's ``threads``-thread matmul of the model's MLP shape, measured
    once per machine signature and cached (a later run reads the cache: no measurement)."""
    import torch

    signature = (
        f"{_machine()}|cpus {os.cpu_count()}|torch {torch.__version__}|threads {threads}|"
        f"{dtype}|{_PEAK_ROWS}x{shape.hidden}x{shape.intermediate}"
    )
    path = cache_dir("peak") / "matmul_flops.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(signature), float):
        return float(cached[signature])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kind = getattr(torch, dtype)
        a = torch.randn(_PEAK_ROWS, shape.hidden, dtype=kind)
        b = torch.randn(shape.hidden, shape.intermediate, dtype=kind)
        flops = 2.0 * _PEAK_ROWS * shape.hidden * shape.intermediate
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(5):  # the best of 5 runs of 4: a busy machine only slows some
            start = time.perf_counter()
            for _ in range(4):
                a @ b
            best = min(best, (time.perf_counter() - start) / 4)
    finally:
        torch.set_num_threads(before)
    rate = flops / best
    cached = cached if isinstance(cached, dict) else {}
    cached[signature] = rate
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cached, indent=1))
        tmp.replace(path)
    except OSError as err:  # a cache that cannot be written costs a measurement next run
        log.warning("could not cache the measured matmul peak in %s: %s", path, err)
    log.info("measured matmul peak: %.1f GFLOP/s per process (%s)", rate / 1e9, signature)
    return rate


def mfu_metrics(
    flops: Mapping[str, float],
    metrics: Mapping[str, float],
    peak_per_process: float,
    ranks: Mapping[str, int],
) -> dict[str, float]:
    """``perf/mfu/<phase>`` and ``perf/model_tflops/<phase>`` (the step's model FLOPs) for
    ``update`` and ``generate``, from the step's worker times in ``metrics`` and the worker
    processes of each phase in ``ranks``."""
    out: dict[str, float] = {}
    times = {
        "update": metrics.get("timing_s/worker/actor_forward_backward", 0.0)
        + metrics.get("timing_s/worker/actor_optimizer", 0.0),
        "generate": metrics.get("timing_s/worker/generate", 0.0),
    }
    for phase, model_flops in flops.items():
        out[f"perf/model_tflops/{phase}"] = model_flops / 1e12
        seconds = times.get(phase, 0.0)
        if seconds > 0 and peak_per_process > 0:
            peak = peak_per_process * max(ranks.get(phase, 1), 1)
            out[f"perf/mfu/{phase}"] = model_flops / (seconds * peak)
    return out


@dataclass(frozen=True)
class MfuMeter:
    """The run's MFU per step: the policy model's shape, one worker's peak, and how many
    worker processes share each phase."""

    shape: ModelShape
    peak_per_process: float
    update_ranks: int
    generate_ranks: int

    def metrics(self, batch: DataProto, metrics: Mapping[str, float]) -> dict[str, float]:
        ranks = {"update": self.update_ranks, "generate": self.generate_ranks}
        return mfu_metrics(
            step_model_flops(self.shape, batch), metrics, self.peak_per_process, ranks
        )


def mfu_meter(
    model_path: str,
    *,
    device: str,
    dtype: str,
    threads: int,
    update_ranks: int,
    generate_ranks: int,
) -> MfuMeter | None:
    """The meter for a policy at ``model_path``, or None where MFU cannot be stated: a model
    whose ``config.json`` is not a decoder's this count knows, or a GPU of unknown peak."""
    try:
        shape = ModelShape.from_config(model_path)
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        log.info("no perf/mfu: %s/config.json is not a decoder config this count reads", model_path)
        return None
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
        peak = declared_peak_flops(name)
        if peak is None:
            log.info("no perf/mfu: no declared peak for the GPU %r (rlcore.tracking.flops)", name)
            return None
    else:
        peak = measured_peak_flops(shape, threads, dtype)
    return MfuMeter(shape, peak, update_ranks, generate_ranks)
