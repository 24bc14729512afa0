"""Padded vs padding-free (``use_remove_padding``) vs shared-prompt micro-batches (FSDP2).

    python benchmarks/packing.py                          # quickstart model, then ~17 M model
    python benchmarks/packing.py --models quickstart --repeats 3
    python benchmarks/packing.py --lengths uniform        # responses of 1..R tokens
    python benchmarks/packing.py --samples 1              # every prompt distinct

Models (random weights, ``rlcore.testing.tiny_model``): "quickstart" (hidden 128, 4 layers,
4 heads, 2 KV heads, tied: the quickstart's shape) and "17m" (hidden 512, 6 layers, 8 heads:
``benchmarks/vs_trl.py``'s). A GRPO-shaped batch per model: ``rows / samples`` prompts of
33-37 tokens, each repeated ``--samples`` times (GRPO's n, default 8), left-padded to 64 (the
quickstart's chat prompts), responses right-padded to R with lengths drawn by
``--lengths``: "quickstart" (14-21 of R=24: answers such as "12 + 34 = 46\n#### 46"),
"uniform" (1..R, R=64: the spread a model early in RL training produces), "full" (all R:
a random model with no EOS, vs_trl's degenerate rows: nothing to remove but left padding).

Each repeat runs, interleaved and on the same weights: padded, packed (one segment per row,
``share_prompts = false``) and shared (each group's prompt once, the default): one
``compute_log_prob`` (the old-log-prob / reference pass) and one ``forward_backward`` +
``optimizer_step`` (the update), with the default token-budget micro-batches (16384 tokens;
packed, the budget counts valid tokens). Printed: median seconds per pass, the tokens the
model ran (padded: rows x trimmed width per micro-batch; packed: valid tokens; shared: valid
tokens with each group's prompt once) and the ratios to padded. One thread
(``torch.set_num_threads(1)``); state the machine's load next to any number.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "quickstart": {
        "hidden": 128,
        "layers": 4,
        "heads": 4,
        "kv_heads": 2,
        "tie_word_embeddings": True,
    },
    "17m": {"hidden": 512, "layers": 6, "heads": 8, "kv_heads": 8, "tie_word_embeddings": False},
}
PROMPT_COLUMNS = 64
RESPONSE_COLUMNS = {"quickstart": 24, "uniform": 64, "full": 64}
# name -> (use_remove_padding, share_prompts)
VARIANTS = {"padded": (False, False), "packed": (True, False), "shared": (True, True)}


def make_batch(rows: int, lengths: str, seed: int = 0, samples: int = 1) -> Any:
    """A GRPO-shaped batch: ``rows // samples`` prompts, each repeated ``samples`` times."""
    import torch

    from rlcore.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    r = RESPONSE_COLUMNS[lengths]
    t = PROMPT_COLUMNS + r
    ids = torch.randint(3, 250, (rows, t), generator=g)
    prompt_of = torch.arange(rows) // samples  # GRPO's repeat(interleave=True) layout
    ids[:, :PROMPT_COLUMNS] = ids[prompt_of * samples, :PROMPT_COLUMNS]
    attn = torch.ones(rows, t, dtype=torch.long)
    resp_mask = torch.ones(rows, r, dtype=torch.long)
    prompt_lens = torch.randint(33, 38, (rows,), generator=g)[prompt_of * samples]
    if lengths == "quickstart":
        resp_lens = torch.randint(14, 22, (rows,), generator=g)
    elif lengths == "uniform":
        resp_lens = torch.randint(1, r + 1, (rows,), generator=g)
    else:
        resp_lens = torch.full((rows,), r)
    for i in range(rows):
        attn[i, : PROMPT_COLUMNS - int(prompt_lens[i])] = 0
        resp_mask[i, int(resp_lens[i]) :] = 0
        attn[i, PROMPT_COLUMNS + int(resp_lens[i]) :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT_COLUMNS:],
            "response_mask": resp_mask,
            "advantages": torch.randn(rows, r, generator=g) * resp_mask,
        }
    )


def model_tokens(engine: Any, batch: Any) -> int:
    """Tokens the model runs over for ``batch``: what each micro-batch feeds it."""
    from rlcore.engine.micro_batches import split_micro_batches
    from rlcore_fsdp2.batching import trim_left_padding
    from rlcore_fsdp2.packing import pack

    total = 0
    mbs = split_micro_batches(  # the split the engine's update uses (rlcore.engine.loop)
        batch,
        micro_batch_size=engine.spec.micro_batch_size,
        max_tokens=engine.spec.max_tokens_per_micro_batch,
        packed=engine.config.use_remove_padding,
        share_prompts=engine._share_prompts,
    )
    for mb in mbs:
        mask = mb.batch["attention_mask"]
        if engine.config.use_remove_padding:
            b = mb.batch
            packed = pack(
                b["input_ids"],
                mask,
                b["position_ids"],
                b["responses"],
                share_prompts=engine._share_prompts,
            )
            total += packed.input_ids.shape[1]
        else:
            ids, _, _ = trim_left_padding(mb.batch["input_ids"], mask, mb.batch["position_ids"])
            total += ids.numel()
    return total


def pg_loss(outputs: Any, mb: Any, totals: Any) -> tuple[Any, dict[str, float]]:
    mask = mb.batch["response_mask"].float()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def bench_model(name: str, root: Path, args: argparse.Namespace) -> list[str]:
    from rlcore.interfaces import EngineSpec, OptimConfig
    from rlcore.testing.tiny_model import build_tiny_model
    from rlcore_fsdp2.engine import FSDP2Engine

    path = str(build_tiny_model(root / name, **MODELS[name]))
    batch = make_batch(args.rows, args.lengths, samples=args.samples)
    engines = {}
    for variant, (packed, shared) in VARIANTS.items():
        spec = EngineSpec(
            role="actor",
            model_path=path,
            optim=OptimConfig(lr=1e-5),
            micro_batch_size=None,
            max_tokens_per_micro_batch=args.max_tokens,
            gradient_checkpointing=args.gradient_checkpointing,
        )
        config = FSDP2Engine.Config(use_remove_padding=packed, share_prompts=shared)
        engines[variant] = FSDP2Engine(spec, config)
    times: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.repeats + 1):  # repeat 0 warms up
        for variant, engine in engines.items():
            t0 = time.perf_counter()
            engine.compute_log_prob(batch, temperature=1.0)
            t1 = time.perf_counter()
            engine.forward_backward(batch, pg_loss, temperature=1.0)
            engine.optimizer_step(lr=1e-5)
            t2 = time.perf_counter()
            if rep:
                times.setdefault((variant, "log_prob"), []).append(t1 - t0)
                times.setdefault((variant, "update"), []).append(t2 - t1)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = {v: model_tokens(e, batch) for v, e in engines.items()}
    params = sum(p.numel() for p in engines["padded"].model.parameters())
    valid = int(batch.batch["response_mask"].sum())
    lines = []
    for phase in ("log_prob", "update"):
        pad, pk, sh = (med[(v, phase)] for v in VARIANTS)
        lines.append(
            f"| {name} ({params / 1e6:.2f} M) | {phase} | {pad:.3f} | {pk:.3f} | {sh:.3f} | "
            f"{pk / pad:.2f} | {sh / pad:.2f} | {tokens['padded']} | {tokens['packed']} | "
            f"{tokens['shared']} | {valid} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rows", type=int, default=128, help="rows per step (16 x 8)")
    parser.add_argument("--lengths", default="quickstart", choices=list(RESPONSE_COLUMNS))
    parser.add_argument(
        "--samples", type=int, default=8, help="rows per prompt (GRPO's n; 1: all distinct)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    print(
        f"rows {args.rows} ({args.samples} per prompt), lengths {args.lengths!r}, "
        f"{args.repeats} repeats (median), "
        f"budget {args.max_tokens} tokens, checkpointing {args.gradient_checkpointing}, 1 thread"
    )
    print(
        "| model | pass | padded s | packed s | shared s | packed/padded | shared/padded | "
        "padded tokens | packed tokens | shared tokens | response tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for line in bench_model(name, Path(tmp), args):
                print(line, flush=True)


if __name__ == "__main__":
    main()
