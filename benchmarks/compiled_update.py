"""Eager vs compiled update (``actor.compile``) of the FSDP2 engine on the quickstart model.

    python benchmarks/compiled_update.py                    # 256 rows (32 prompts x 8), 5 repeats
    python benchmarks/compiled_update.py --repeats 9 --rows 128

The quickstart's shape (``benchmarks/packing.py``'s "quickstart" model, random weights) and a
GRPO-shaped batch (its ``make_batch``: prompts of 33-37 tokens left-padded to 64, responses of
14-21 tokens of R=24), micro-batches of 128 rows and the quickstart's data maxima (prompt 64,
response 24), so the compiled update runs one bucket shape (128 x 64 x 24). Variants, each an
engine on the same weights:

- ``eager``: the default engine (padding-free, shared prompts);
- ``eager-padded``: ``use_remove_padding = false`` (the padded layout the compiled update uses);
- ``compiled``: ``compile = true`` (default engine options; the update at the bucket shape).

Two warm-up rounds: for ``compiled`` the first runs its two micro-batches eager, the second
compiles on its first micro-batch (``rlcore_fsdp2.compiled``). Then
``--repeats`` rounds, interleaved, of one update (``forward_backward`` + ``optimizer_step``)
per variant. Printed: median, min-max spread, the compile cost (the warm-up call minus the
compiled median, and the engine's own ``perf/compile_s/actor``) and the break-even step count
(compile cost / (eager median - compiled median)). One thread; Inductor's on-disk cache
(/tmp/torchinductor_$USER) makes a second run's compile shorter: say which one you report,
and the machine's load beside any number.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from packing import MODELS, make_batch, pg_loss

PROMPT_MAX, RESPONSE_MAX = 64, 24  # the quickstart's data.max_prompt_length / response
WARMUP = 2  # rounds before timing: the compiled engine's eager passes, then its compile


def build(path: str, variant: str, micro: int) -> Any:
    from rlcore.interfaces import EngineSpec, OptimConfig
    from rlcore_fsdp2.engine import FSDP2Engine

    spec = EngineSpec(
        role="actor",
        model_path=path,
        optim=OptimConfig(lr=1e-5),
        micro_batch_size=micro,
        max_prompt_length=PROMPT_MAX,
        max_response_length=RESPONSE_MAX,
        compile=variant == "compiled",
    )
    return FSDP2Engine(spec, FSDP2Engine.Config(use_remove_padding=variant != "eager-padded"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=256, help="rows per update (32 x 8)")
    parser.add_argument("--micro-batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from rlcore.testing.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    variants = ("eager", "eager-padded", "compiled")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "quickstart", **MODELS["quickstart"]))
        batch = make_batch(args.rows, "quickstart", samples=8)
        engines = {v: build(path, v, args.micro_batch_size) for v in variants}
        times: dict[str, list[float]] = {v: [] for v in variants}
        warm: dict[str, float] = {}
        compile_metric = 0.0
        for rep in range(args.repeats + WARMUP):
            for variant, engine in engines.items():
                t0 = time.perf_counter()
                metrics = engine.forward_backward(batch, pg_loss, temperature=1.0)
                engine.optimizer_step(lr=1e-5)
                seconds = time.perf_counter() - t0
                compile_metric += metrics.get("perf/compile_s/actor", 0.0)
                if rep < WARMUP:
                    warm[variant] = seconds  # the last warm-up call's
                else:
                    times[variant].append(seconds)
    med = {v: statistics.median(t) for v, t in times.items()}
    print(
        f"rows {args.rows} (8 per prompt), micro-batches of {args.micro_batch_size}, "
        f"{args.repeats} interleaved repeats, 1 thread"
    )
    print("| variant | update median s | min-max s | vs eager |")
    print("|---|---|---|---|")
    for v in variants:
        lo, hi = min(times[v]), max(times[v])
        print(f"| {v} | {med[v]:.3f} | {lo:.3f}-{hi:.3f} | {med['eager'] / med[v]:.2f}x |")
    cost = warm["compiled"] - med["compiled"]  # one compiling pass + one compiled pass
    saving = med["eager"] - med["compiled"]
    print(
        f"compile: warm-up call {warm['compiled']:.1f} s - compiled {med['compiled']:.2f} s = "
        f"{cost:.1f} s (the engine's perf/compile_s/actor: {compile_metric:.1f} s)"
    )
    if saving > 0:
        print(f"break-even: {cost / saving:.0f} updates ({saving:.3f} s saved per update)")
    else:
        print(f"break-even: never (the compiled update is {-saving:.3f} s slower than eager)")


if __name__ == "__main__":
    main()
