"""Rollout throughput: raw ``model.generate``, the HF rollout and the vLLM rollout, tokens/s.

"HFRollout, concat cache" is the HF rollout with ``preallocate_kv_cache = false``
(transformers' ``DynamicCache``, which concatenates at every step); "raw model.generate"
uses that cache too. "HFRollout compiled" is ``rollout.compile_decode = true``
(rlcore_hf.compiled_decode: a torch.compile'd decoding step in a loop of its own); its
compile time is printed apart, once per model.

    python benchmarks/rollout.py [--device cpu|cuda] [--models quickstart,20m | --model PATH]
                                 [--rows 8,256] [--max-new-tokens 64] [--reps 3]
                                 [--async-engine] [--vllm-bf16] [--no-compiled]
                                 [--variants 'HFRollout,HFRollout compiled'] [--quick]

``--quick``: a smoke run (rows 8 and 32, 16 new tokens, one timed call each) that checks
every row prints; its numbers are not measurements. ``--async-engine`` adds a row for the
vLLM rollout on vLLM's AsyncLLM (``[rollout] async_engine = true``, as agent runs use it);
``--vllm-bf16`` one with ``[rollout] dtype = "bfloat16"`` (weights cast from float32).

Each model is benchmarked at each batch size (``--rows``: responses per call, prompts already
expanded as the driver does). All three sample at temperature 1, top-p 1, from the same
weights. The models: the quickstart's (``examples/quickstart/make_model.py``, ~1 M params) and
a ~20 M-parameter Qwen2 (hidden 512, 8 layers, 8 heads of 64); random weights, so EOS is rare
and every row generates about ``max_new_tokens``. Tokens are counted from ``response_mask``
(generated tokens up to EOS). One torch thread for HF on CPU; vLLM runs in-process with the
same thread count (``OMP_NUM_THREADS``). The vLLM rows need vLLM (``.venv-vllm``; see the
README), the rest run anywhere. Medians of ``--reps`` rounds after a warm-up call each, every
round timing each variant once (interleaved), with the min-max of tokens/s; engine start times
are printed apart. On a shared machine, numbers move with the load: compare ratios, and the
tokens per CPU second of this process (one thread: what the call itself ran).

Measured on the idle 2-core machine (AVX512-BF16), ``--vllm-bf16 --max-new-tokens 32 --reps 3``,
tokens/s and ratio to HFRollout:

    model        rows  raw generate  HFRollout  VLLMRollout  VLLMRollout bf16
    quickstart      8     1507 1.16   1298 1.00   1270 0.98    1748 1.35
    quickstart    256     4304 1.16   3707 1.00   6672 1.80    9711 2.62
    20m             8      281 1.07    263 1.00    466 1.77     639 2.42
    20m           256      325 1.14    284 1.00    869 3.06    1401 4.93

vLLM wins where the batch is large (3.1x float32, 4.9x bfloat16 on the 20M model at 256 rows)
and loses where batch and model are both small (8 rows of the 1M model: its per-step Python
scheduling costs what HF's does), and on what surrounds the calls: an engine start of 2-8 s
in-process (HF ~1 s), its own environment, a KV cache reserved up front. In the quickstart's
loop (SFT model, ~21 tokens per answer) a float32 engine is no faster than HF; a bfloat16 one
shortens generation by 27-30% and the whole run by 7-8% (README, "vLLM against HF").

The compiled decoding step, measured UNDER LOAD (the 2 cores shared with other sessions'
training runs, load average 6-40; wall tokens/s are a fraction of the idle ones above, read
the ratios), ``--variants 'HFRollout,HFRollout compiled'``: quickstart ``--reps 5``, 64 new
tokens; 20m ``--reps 3 --max-new-tokens 32``. Tokens/s wall and per CPU second, ratio to
HFRollout (eager):

    model        rows  HFRollout wall/cpu  compiled wall/cpu  ratio wall  cpu
    quickstart      8        176 / 1022         366 / 2063         2.09  2.02
    quickstart     64        539 / 3456         868 / 5130         1.61  1.48
    20m             8         28 /  206          35 /  245         1.29  1.19
    20m            64         56 /  419          57 /  472         1.01  1.13

The gain is the per-op cost the compiler removes, so it shrinks as the matmuls grow (20m, 64
rows). Its compile, once per shape: quickstart 34 s wall for its 2 shapes (inductor's on-disk
cache already held them), 20m 680 s wall for 2 (cold, under this load; ~20-40 s of CPU each).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore_hf.rollout import HFRollout

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "What is 12 + 7?",
    "Name three primes.",
    "Hi",
    "Explain gradient descent in one sentence.",
    "2+2=",
    "Write a haiku about the sea.",
    "Count to five:",
    "The capital of France is",
]


def build(name: str, out: Path) -> str:
    if name == "quickstart":
        sys.path.insert(0, str(ROOT / "examples" / "quickstart"))
        from make_model import make_model

        return str(make_model(out / "quickstart"))
    if name == "tiny":  # benchmarks/vs_trl.py's dense row: 0.33M parameters, tied
        from rlcore.testing.tiny_model import build_tiny_model

        return str(build_tiny_model(out / "tiny", hidden=128, layers=2, heads=4, kv_heads=2,
                                    tie_word_embeddings=True))  # fmt: skip
    if name == "20m":
        from rlcore.testing.tiny_model import build_tiny_model

        return str(build_tiny_model(out / "20m", hidden=512, layers=8, heads=8, kv_heads=4))
    msg = f"unknown model {name!r}: quickstart, tiny, 20m"
    raise SystemExit(msg)


def make_prompts(path: str, rows: int) -> DataProto:
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": TEXTS[i % len(TEXTS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(rows)
    ]
    enc = tok(chats, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


def timed_interleaved(fns: dict, reps: int) -> dict[str, tuple[float, ...]]:
    """Per variant: (median seconds, median tokens/s, min and max tokens/s, median tokens per
    CPU second of this process) over ``reps`` rounds, each round timing every variant once
    (interleaved, so load drifts hit all alike), after one warm-up call each (which also
    compiles the compiled variant). With one thread, CPU time is what the call ran, less
    what other processes took from it: the steadier measure on a shared machine (not for
    vLLM, whose engine may run in a process of its own)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    rates: dict[str, list[float]] = {name: [] for name in fns}
    cpu_rates: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens = fn()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            times[name].append(elapsed)
            rates[name].append(tokens / elapsed)
            cpu_rates[name].append(tokens / cpu)
    return {
        name: (statistics.median(times[name]), statistics.median(rates[name]),
               min(rates[name]), max(rates[name]), statistics.median(cpu_rates[name]))
        for name in fns
    }  # fmt: skip


def bench_model(name: str, path: str, args: argparse.Namespace) -> list[tuple]:
    spec = RolloutSpec(
        model_path=path,
        device=args.device,
        dtype=args.dtype,
        max_prompt_length=64,
        max_response_length=args.max_new_tokens,
    )
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    hf = HFRollout(spec)
    n_params = sum(p.numel() for p in hf.model.parameters()) / 1e6
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    variants = {}

    def raw_fn(prompts: DataProto):
        def run() -> int:
            with torch.no_grad():
                out = hf.model.generate(
                    input_ids=prompts.batch["input_ids"].to(hf.device),
                    attention_mask=prompts.batch["attention_mask"].to(hf.device),
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_id=hf.eos_token_ids,
                    pad_token_id=hf.pad_token_id,
                )
            sync()
            resp = out[:, prompts.batch["input_ids"].shape[1] :]
            return int((resp != hf.pad_token_id).sum())

        return run

    def rollout_fn(rollout, prompts: DataProto):
        def run() -> int:
            out = rollout.generate(prompts, sampling)
            sync()
            return int(out.batch["response_mask"].sum())

        return run

    # The HF rollout with transformers' own (concatenating) KV cache: the preallocated
    # cache's gain (rlcore_hf.kv_cache), same tokens.
    hf_concat = HFRollout(spec, HFRollout.Config(preallocate_kv_cache=False))
    variants["raw model.generate"] = lambda p: raw_fn(p)
    variants["HFRollout, concat cache"] = lambda p: rollout_fn(hf_concat, p)
    variants["HFRollout"] = lambda p: rollout_fn(hf, p)
    if args.compiled:  # rlcore_hf.compiled_decode: compiles once per rows/length bucket
        # Compiled in this process, waiting: the rows time the compiled step, not the switch.
        hf_compiled = HFRollout(
            spec, HFRollout.Config(compile_decode=True, compile_in_background=False)
        )
        variants["HFRollout compiled"] = lambda p: rollout_fn(hf_compiled, p)
    start_s = None
    if importlib.util.find_spec("vllm") is not None:
        from rlcore_vllm.rollout import VLLMRollout

        start = time.perf_counter()
        vllm = VLLMRollout(spec, VLLMRollout.Config(kv_cache_space_gb=1.0))
        start_s = time.perf_counter() - start
        variants["VLLMRollout"] = lambda p: rollout_fn(vllm, p)
        if args.vllm_bf16 and args.dtype != "bfloat16":
            config = VLLMRollout.Config(kv_cache_space_gb=1.0, dtype="bfloat16")
            vllm_bf16 = VLLMRollout(spec, config)
            variants["VLLMRollout bf16"] = lambda p: rollout_fn(vllm_bf16, p)
        if args.async_engine:
            start = time.perf_counter()
            config = VLLMRollout.Config(kv_cache_space_gb=1.0, async_engine=True)
            vllm_async = VLLMRollout(spec, config)
            print(f"{name}: vLLM AsyncLLM start {time.perf_counter() - start:.1f} s")
            variants["VLLMRollout async"] = lambda p: rollout_fn(vllm_async, p)
    else:
        print("vLLM is not installed here: only the HF rows (see the README, 'vLLM rollout')")

    results = []
    for rows in args.rows:
        prompts = make_prompts(path, rows)
        chosen = {v: make(prompts) for v, make in variants.items() if v in args.variants}
        for variant, timing in timed_interleaved(chosen, args.reps).items():
            results.append((name, n_params, rows, variant, *timing))
    if args.compiled and hf_compiled._decoder is not None:
        seconds, graphs = hf_compiled._decoder.compile_seconds, hf_compiled._decoder.graphs
        print(f"{name}: compile_decode compiled {graphs} step shape(s) in {seconds:.1f} s")
    if start_s is not None:
        print(f"{name}: vLLM engine start {start_s:.1f} s (once per run)")
        vllm.shutdown()
        if args.async_engine:
            vllm_async.shutdown()
        if "VLLMRollout bf16" in variants:
            vllm_bf16.shutdown()
    return results


class _AllVariants:
    def __contains__(self, item: object) -> bool:
        return True


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="quickstart,20m")
    ap.add_argument("--model", default=None, help="a local HF folder instead of --models")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--rows", default="8,256", help="responses per generate call")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--async-engine", action="store_true", help="add vLLM's AsyncLLM")
    ap.add_argument(
        "--vllm-bf16",
        action="store_true",
        help="add the vLLM rollout with [rollout] dtype = 'bfloat16' (a float32 policy's usual "
        "rollout dtype)",
    )
    ap.add_argument(
        "--no-compiled",
        dest="compiled",
        action="store_false",
        help="leave out the 'HFRollout compiled' row (rollout.compile_decode = true), whose "
        "first call per model and batch size compiles for tens of seconds",
    )
    ap.add_argument(
        "--variants",
        default=None,
        help="comma-separated rows to time (default: all), e.g. 'HFRollout,HFRollout compiled'",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: small, one timed call")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.max_new_tokens, args.reps = "8,32", 16, 1
    args.rows = [int(r) for r in args.rows.split(",")]
    args.variants = set(args.variants.split(",")) if args.variants else _AllVariants()
    if args.device == "cpu":
        torch.set_num_threads(1)

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        models = [("model", args.model)] if args.model else []
        models += [] if args.model else [(m, build(m, Path(tmp))) for m in args.models.split(",")]
        for name, path in models:
            results += bench_model(name, path, args)

    print(
        f"\nrollout benchmark: {args.max_new_tokens} new tokens, temperature 1, {args.dtype} "
        f"on {args.device}, median of {args.reps} interleaved rounds (tokens/s min-max beside "
        "it); ratio = tokens/s / HFRollout's; cpu: tokens per CPU second of this process\n"
    )
    print(
        f"{'model':<12}{'params':>8}{'rows':>6}  {'variant':<25}{'time (s)':>9}"
        f"{'tokens/s':>11}{'min-max':>14}{'ratio':>8}{'cpu tok/s':>11}{'cpu ratio':>11}"
    )
    base = {(r[0], r[2]): (r[5], r[8]) for r in results if r[3] == "HFRollout"}
    for name, n_params, rows, variant, t, rate, low, high, cpu_rate in results:
        wall_base, cpu_base = base.get((name, rows), (float("nan"), float("nan")))
        spread = f"{low:.0f}-{high:.0f}"
        print(
            f"{name:<12}{n_params:>7.1f}M{rows:>6}  {variant:<25}{t:>9.3f}{rate:>11.0f}"
            f"{spread:>14}{rate / wall_base:>8.2f}{cpu_rate:>11.0f}{cpu_rate / cpu_base:>11.2f}"
        )


if __name__ == "__main__":
    main()
