"""Memory per GPU of a recipe (FSDP2 actor + vLLM rollout), computed, not measured.

    python examples/gsm8k/memory.py examples/gsm8k/grpo_7b_8gpu.toml \\
        --model-config examples/gsm8k/model_configs/Qwen2.5-7B-Instruct.json

The recipe is resolved by rlcore's own loader (what ``rlcore config validate`` checks, every
default filled in); the model's shape comes from its Hugging Face ``config.json``
(``--model-config``, else ``<model.path>/config.json``). Each row is what the engines really
allocate on one GPU:

- FSDP2 actor (rlcore_fsdp2/engine.py): with an optimizer, ``mixed_precision`` and a bf16
  ``model.dtype`` the model is loaded in float32 (``_load_model``: ``master``) and sharded over
  the FSDP group, computing in bf16 (``MixedPrecisionPolicy``); its gradients are sharded
  float32 too, and ``torch.optim.AdamW`` keeps ``exp_avg`` and ``exp_avg_sq`` in the
  parameters' dtype (float32). Each layer and then the root (embeddings, final norm, an untied
  ``lm_head``) are ``fully_shard`` units: a layer is gathered in bf16 while it runs (the next
  one prefetched), the root stays gathered from the forward to the end of the backward
  (FSDP2 does not reshard the root after forward), and a unit's unsharded bf16 gradients are
  copied to ``reduce_dtype`` for the reduce-scatter.
- Reference (``use_kl_loss`` / ``use_kl_in_reward``): a second FSDP2 engine without an optimizer,
  loaded in ``model.dtype``, sharded the same way. It leaves the GPU between its forwards only
  with ``offload_during_generation`` (roles/policy.py ``compute_ref_log_prob``).
- Activations of one micro-batch of ``max_tokens_per_micro_batch`` tokens (per token and layer:
  :func:`layer_activation_bytes`, counted from autograd's saved tensors): with gradient
  checkpointing each decoder layer keeps its bf16 input, and one layer at a time recomputes
  its full set; without, every layer keeps its full set.
- Logits: only response positions go through ``lm_head`` (``logits_to_keep``), at most every
  token of the micro-batch: bf16 logits kept for the backward plus their bf16 gradient, and
  the float32 log-softmax / entropy temporaries of one ``log_prob_chunk_tokens`` chunk
  (rlcore/engine/log_probs.py ``_chunked``).
- vLLM (rlcore_vllm/rollout.py): ``gpu_memory_utilization`` x device memory while it
  generates (its bf16 weights / ``tensor_parallel_size``, its own activations and CUDA graphs,
  the KV cache: the rest); asleep (``enable_sleep_mode``, on by default on GPU) it holds none of
  it: level 1 moves the weights to CPU RAM, level 2 drops them.
- Colocated order (roles/policy.py): the rollout generates with the actor and reference
  offloaded when ``offload_during_generation`` (else resident, gradients freed by
  ``zero_grad(set_to_none=True)``); weight sync wakes vLLM's weights, onloads the actor and
  gathers float32 buckets (rlcore_fsdp2/weights.py: ``SYNC_BUCKET_BYTES``, at least one whole
  tensor, peak about 3x a bucket); training runs with vLLM asleep.

Not counted: the CUDA context and NCCL buffers of each process, allocator fragmentation, what
vLLM keeps while asleep. So a recipe should leave a few GiB of headroom.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

GIB = 1 << 30
# What torch.cuda reports as total memory on an "80 GB" H100 / A100 (about 85.0e9 bytes).
DEFAULT_DEVICE_GIB = 79.2
SYNC_BUCKET_BYTES = 128 << 20  # rlcore_fsdp2.weights.SYNC_BUCKET_BYTES
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Decoder families whose parameters this module counts (a Llama-style block).
FAMILIES = ("qwen2", "llama", "mistral")


class RecipeError(ValueError):
    """The recipe or the model config is outside what this calculator models (one line)."""


@attrs.frozen(kw_only=True)
class ModelShape:
    """The sizes of a Llama-style decoder (Qwen2, Llama, Mistral) from its config.json."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool
    o_bias: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str = "config.json") -> ModelShape:
        family = cfg.get("model_type")
        if family not in FAMILIES:
            msg = f"{source}: model_type {family!r} is not one of {', '.join(FAMILIES)}"
            raise RecipeError(msg)
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        # Qwen2's q/k/v projections always have a bias (no key); Llama's follow attention_bias.
        bias = bool(cfg.get("attention_bias", False))
        return cls(
            vocab=int(cfg["vocab_size"]),
            hidden=hidden,
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bias,
            o_bias=family != "qwen2" and bias,
        )

    @classmethod
    def read(cls, path: Path) -> ModelShape:
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise RecipeError(f"cannot read the model config {path}: {err}") from None
        try:
            return cls.from_config(cfg, str(path))
        except KeyError as err:
            raise RecipeError(f"{path}: no {err.args[0]!r}") from None

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def layer(self) -> int:
        """Parameters of one decoder layer: q/k/v/o, the SwiGLU MLP, two RMSNorms."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        attention += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def root(self) -> int:
        """The root FSDP unit: embeddings, final norm and an untied lm_head."""
        return self.embedding * (1 if self.tied else 2) + self.hidden

    @property
    def parameters(self) -> int:
        return self.root + self.layers * self.layer

    @property
    def largest_tensor(self) -> int:
        return max(self.embedding, self.hidden * self.intermediate)

    def kv_cache_bytes_per_token(self, dtype_bytes: int, tp: int) -> int:
        """One token's K and V on one tensor-parallel rank (KV heads split, at least one)."""
        heads = max(1, self.kv_heads // tp)
        return 2 * self.layers * heads * self.head_dim * dtype_bytes


def layer_activation_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Bytes one token's pass through one decoder layer keeps for the backward.

    The tensors autograd saves in a transformers Qwen2 layer under rlcore's packed attention
    (tests/test_gsm8k_recipes.py counts them with ``saved_tensors_hooks`` on CPU, bf16):
    each RMSNorm keeps its float32 upcast, its float32 1/rms, its normalised output and the
    weighted output the projections read; attention keeps q and k after RoPE, k and v repeated
    to every query head (rlcore_fsdp2.packing's grouped-query path; the shared-prompt path
    keeps them unrepeated) and its output (o_proj reads the same storage), plus a float32
    logsumexp per head; the SwiGLU MLP keeps gate, up, SiLU(gate) and their product.
    """
    h, q = shape.hidden, shape.heads * shape.head_dim
    norms = 2 * ((4 + 2 * compute_bytes) * h + 4)
    attention = 4 * q * compute_bytes + 4 * shape.heads
    mlp = 4 * shape.intermediate * compute_bytes
    return norms + attention + mlp


@attrs.frozen(kw_only=True)
class Row:
    name: str
    bytes: int
    note: str = ""


@attrs.frozen(kw_only=True)
class Phase:
    name: str
    rows: tuple[Row, ...]

    @property
    def total(self) -> int:
        return sum(r.bytes for r in self.rows)


@attrs.frozen(kw_only=True)
class Report:
    title: str
    device_bytes: int
    phases: tuple[Phase, ...]
    facts: tuple[str, ...]

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)


def _options(section: Any, kind: str, expected: str) -> Any:
    if section.name != expected:
        msg = f"memory.py models the {expected!r} {kind}; this recipe sets {section.name!r}"
        raise RecipeError(msg)
    return section.options


def estimate(config: Any, shape: ModelShape, device_bytes: int) -> Report:
    """The per-GPU memory of each phase of a colocated step of ``config`` (a RunConfig)."""
    engine = _options(config.actor.engine, "[actor.engine]", "fsdp2")
    rollout = _options(config.rollout, "[rollout]", "vllm")
    if engine.lora_rank:
        raise RecipeError("memory.py models full training; [actor.engine] lora_rank is set")
    if config.resources.separate_rollout() is not None:
        raise RecipeError("memory.py models a colocated rollout; this recipe places it apart")
    world = config.resources.world_size
    shard = world if engine.fsdp_size == -1 else engine.fsdp_size
    p = shape.parameters
    compute = BYTES[config.model.dtype]
    mixed = engine.mixed_precision and config.model.dtype != "float32"
    master = 4 if mixed else compute
    reduce = BYTES[engine.reduce_dtype] if mixed else compute
    on_gpu = not engine.offload_params  # CPUOffloadPolicy keeps shards and the step on CPU
    options = config.algorithm.options
    ref = bool(
        getattr(options, "use_kl_loss", False) or getattr(options, "use_kl_in_reward", False)
    )
    offloads = engine.offload_during_generation and on_gpu
    cpu = "0: on CPU (offload_params)"

    params = Row(
        name="actor parameters",
        bytes=p * master // shard if on_gpu else 0,
        note=f"{'float32' if master == 4 else config.model.dtype} master, / {shard}"
        if on_gpu
        else cpu,
    )
    grads = Row(
        name="actor gradients",
        bytes=params.bytes,
        note="sharded like the parameters" if on_gpu else cpu,
    )
    adam = Row(
        name="AdamW exp_avg + exp_avg_sq",
        bytes=2 * params.bytes,
        note=f"parameters' dtype, / {shard}" if on_gpu else cpu,
    )
    reference = Row(
        name="reference parameters",
        bytes=p * compute // shard if ref and on_gpu else 0,
        note=(f"{config.model.dtype}, / {shard}" if on_gpu else cpu) if ref else "no KL: none",
    )

    # One micro-batch's forward and backward: what is resident, then the three moments of the
    # backward whose transients do not overlap (FSDP2 frees each before the next).
    tokens = config.actor.max_tokens_per_micro_batch or 0
    if tokens == 0:
        msg = "memory.py needs [actor] max_tokens_per_micro_batch (a token budget per micro-batch)"
        raise RecipeError(msg)
    held_ref = reference if not offloads else attrs.evolve(reference, bytes=0, note="offloaded")
    resident = (params, grads, adam, held_ref)
    root = Row(
        name="FSDP2 root unit gathered",
        bytes=shape.root * compute,
        note="embeddings, lm_head, norm; kept through the backward",
    )
    layers = Row(
        name="FSDP2 decoder layers gathered",
        bytes=shape.layer * compute * (2 if engine.reshard_after_forward else shape.layers),
        note="running + prefetched" if engine.reshard_after_forward else "all (no reshard)",
    )
    per_token = layer_activation_bytes(shape, compute)
    checkpointing = config.actor.gradient_checkpointing
    kept = Row(
        name="activations kept",
        bytes=tokens * shape.layers * (shape.hidden * compute if checkpointing else per_token),
        note=f"{tokens} tokens x {shape.layers} layers x "
        + (
            f"{shape.hidden * compute:,} B (checkpointed inputs)"
            if checkpointing
            else f"{per_token:,} B"
        ),
    )
    one_layer = Row(
        name="activations of one layer",
        bytes=tokens * per_token,
        note=f"{tokens} tokens x {per_token:,} B: recomputed, or a forward's transient",
    )
    chunk = min(engine.log_prob_chunk_tokens or tokens, tokens)
    chunks = Row(
        name="log-softmax chunk temporaries",
        bytes=3 * chunk * shape.vocab * 4,
        note=f"3 x {chunk} x {shape.vocab} float32",
    )
    scaled = config.rollout.temperature not in (0.0, 1.0)  # logits / T: one more copy
    logits = Row(
        name="logits (+ their gradient)",
        bytes=(2 + scaled) * tokens * shape.vocab * compute,
        note=f"{2 + scaled} x {tokens} x {shape.vocab} x {compute} B (every token a response)",
    )
    head_grad = Row(
        name="lm_head gradient (unsharded)",
        bytes=shape.embedding * compute,
        note="held until the root's reduce-scatter",
    )
    asleep = Row(name="vLLM (asleep)", bytes=0, note=f"sleep level {rollout.sleep_level}")
    backward_logits = Phase(
        name="backward: logits",
        rows=(*resident, root, layers, kept, logits, chunks, head_grad, asleep),
    )
    backward_layer = Phase(
        name="backward: a layer",
        rows=(
            *resident,
            root,
            layers,
            kept,
            *((one_layer,) if checkpointing else ()),
            Row(
                name="FSDP2 one layer's gradients",
                bytes=shape.layer * (compute + reduce),
                note="unsharded + reduce-scatter copy",
            ),
            head_grad,
            asleep,
        ),
    )
    backward_root = Phase(
        name="backward: root reduce",
        rows=(
            *resident,
            root,
            Row(
                name="FSDP2 root unit gradients",
                bytes=shape.root * (compute + reduce),
                note="unsharded + reduce-scatter copy",
            ),
            asleep,
        ),
    )
    step = Phase(
        name="optimizer step",
        rows=(
            *resident,
            Row(
                name="AdamW foreach temporary",
                bytes=params.bytes,
                note="sqrt(exp_avg_sq), one shard",
            ),
        ),
    )
    # old_log_probs / the reference's forward: no gradients (freed after each step), no
    # activations kept, the micro-batch's logits once; the larger of the two budgets.
    forward_tokens = max(tokens, config.ref.max_tokens_per_micro_batch or 0)
    log_prob = Phase(
        name="log-prob forward",
        rows=(
            params,
            attrs.evolve(grads, bytes=0, note="freed after the step"),
            adam,
            reference,
            root,
            layers,
            attrs.evolve(one_layer, bytes=forward_tokens * per_token),
            attrs.evolve(
                logits,
                name="logits",
                bytes=(1 + scaled) * forward_tokens * shape.vocab * compute,
                note=f"{1 + scaled} x {forward_tokens} x {shape.vocab} x {compute} B, no gradient",
            ),
            chunks,
            asleep,
        ),
    )

    # vLLM: its share of the device while it generates.
    tp = rollout.tensor_parallel_size
    rollout_bytes = BYTES[rollout.dtype or config.model.dtype]
    vllm_share = int(rollout.gpu_memory_utilization * device_bytes)
    vllm_weights = p * rollout_bytes // tp
    awake = not offloads
    absent = "offloaded (offload_during_generation)"
    generation = Phase(
        name="generation",
        rows=(
            params if awake else attrs.evolve(params, bytes=0, note=absent),
            adam if awake else attrs.evolve(adam, bytes=0, note=absent),
            reference if awake else attrs.evolve(reference, bytes=0, note=absent),
            Row(
                name="vLLM share",
                bytes=vllm_share,
                note=f"gpu_memory_utilization {rollout.gpu_memory_utilization} x device",
            ),
        ),
    )
    bucket = max(SYNC_BUCKET_BYTES, shape.largest_tensor * master)
    sync = Phase(
        name="weight sync",
        rows=(
            params,
            adam,
            generation.rows[2],
            Row(name="gathered buckets", bytes=3 * bucket, note="3 x max(128 MiB, a tensor)"),
            Row(name="vLLM weights (awake)", bytes=vllm_weights, note=f"/ tensor_parallel {tp}"),
        ),
    )

    kv_per_token = shape.kv_cache_bytes_per_token(rollout_bytes, tp)
    kv_cache = vllm_share - vllm_weights
    max_len = rollout.max_model_len or (
        config.data.max_prompt_length + config.data.max_response_length
    )
    rows_per_engine = config.data.train_batch_size * config.rollout.n * tp // world
    facts: tuple[str, ...] = (
        f"model: {p:,} parameters ({shape.layers} layers, hidden {shape.hidden}, "
        f"vocab {shape.vocab}, {'tied' if shape.tied else 'untied'} embeddings)",
        f"FSDP2 shards over {shard} of {world} GPUs; compute {config.model.dtype}, "
        f"master {'float32' if master == 4 else config.model.dtype}, "
        f"reduce {'float32' if reduce == 4 else config.model.dtype}",
        f"vLLM: {world // tp} engine(s) of tensor_parallel_size {tp}; KV cache at most "
        f"{kv_cache / GIB:.1f} GiB per GPU (share - weights; its activations and CUDA graphs "
        f"come out of it) = {kv_cache // kv_per_token:,} tokens at {kv_per_token:,} B/token = "
        f"{kv_cache // kv_per_token // max_len:,} sequences of max_model_len {max_len} "
        f"(max_num_seqs {rollout.max_num_seqs}; {rows_per_engine} rows per engine per step)",
    )
    # The rollout starts after the actor and reference are built (offloaded first only with
    # offload_during_generation; AdamW's states come at the first step) and vLLM refuses to
    # start unless its whole share is free.
    at_start = (params.bytes + reference.bytes) if awake else 0
    facts += (
        f"vLLM's start: {at_start / GIB:.2f} GiB of the actor and reference resident, "
        f"{(device_bytes - at_start) / GIB:.1f} GiB free for its {vllm_share / GIB:.1f} GiB share"
        + ("" if device_bytes - at_start >= vllm_share else " (TOO LITTLE: vLLM will refuse)"),
    )
    title = f"{config.trainer.experiment_name}: per GPU of {device_bytes / GIB:.1f} GiB"
    return Report(
        title=title,
        device_bytes=device_bytes,
        phases=(backward_logits, backward_layer, backward_root, step, log_prob, generation, sync),
        facts=facts,
    )


def render(report: Report) -> str:
    """One Markdown table: a row per allocation, a column per phase (GiB), the peak named."""
    names: list[str] = []
    notes: dict[str, str] = {}
    for phase in report.phases:
        for row in phase.rows:
            if row.name not in notes:
                names.append(row.name)
                notes[row.name] = row.note
    names.sort(key=lambda name: name.startswith("vLLM"))  # stable: vLLM's rows last
    cells = [{r.name: r.bytes for r in phase.rows} for phase in report.phases]
    heads = [p.name for p in report.phases]
    lines = [f"### {report.title}", "", *(f"- {fact}" for fact in report.facts), ""]
    lines.append("| GiB per GPU | " + " | ".join(heads) + " | how |")
    lines.append("|---|" + "---:|" * len(heads) + "---|")
    for name in names:
        values = [f"{c[name] / GIB:.2f}" if name in c else "" for c in cells]
        lines.append(f"| {name} | " + " | ".join(values) + f" | {notes[name]} |")
    totals = [f"**{p.total / GIB:.2f}**" for p in report.phases]
    lines.append("| **total** | " + " | ".join(totals) + " | |")
    peak = report.peak
    free = report.device_bytes - peak.total
    verdict = (
        f"{free / GIB:.2f} GiB left for the CUDA context, NCCL and fragmentation"
        if free > 0
        else f"DOES NOT FIT: {-free / GIB:.2f} GiB over"
    )
    lines += [
        "",
        f"Peak: {peak.name}, {peak.total / GIB:.2f} of {report.device_bytes / GIB:.1f} GiB "
        f"({verdict}).",
    ]
    return "\n".join(lines) + "\n"


def load(
    recipe: str, model_config: str | None, overrides: Sequence[str] = ()
) -> tuple[Any, ModelShape]:
    """The resolved recipe (rlcore's loader) and the shape of its model."""
    from rlcore.config import load_config

    config = load_config(recipe, overrides)
    path = Path(model_config) if model_config else Path(config.model.path) / "config.json"
    return config, ModelShape.read(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="a run config (TOML)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="as rlcore train's")
    parser.add_argument("--model-config", help="the model's config.json; default: model.path's")
    parser.add_argument(
        "--device-gib", type=float, default=DEFAULT_DEVICE_GIB, help="memory of one GPU (GiB)"
    )
    args = parser.parse_args(argv)
    from rlcore.config import ConfigValidationError

    try:
        config, shape = load(args.recipe, args.model_config, args.overrides)
        report = estimate(config, shape, int(args.device_gib * GIB))
    except ConfigValidationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
