"""The HF rollout's generation levers, each on and off: ``share_prompt_prefill`` (default),
``share_prompt_kv`` and ``inverse_cdf_sampling`` (``--lever``).

The prefill lever is measured with ``share_prompt_kv`` off on both sides (it would otherwise
follow the prefill's setting); the other two with everything else at its default. With
``inverse_cdf_sampling`` the two sides draw from one distribution with different random
streams, so their tokens are not compared ("n/a").

GRPO's ``n`` samples of a prompt are ``n`` identical adjacent rows; with the lever on, each
distinct prompt is prefilled once and its KV cache and last logits copied to its samples
(``rlcore_hf.shared_prefill``). Same model, same rows, same seed: the two variants run
interleaved (off, on, off, on, ...) so a shared machine's load hits both alike; the ratio
is per repeat (off time / on time), reported as median and range. Every repeat also checks
that the sampled tokens are identical, and one extra call that the log-probs agree.

    python benchmarks/shared_prefill.py [--models quickstart,20m] [--prompt-lengths 34,256]
                                        [--prompts 8] [--n 8] [--max-new-tokens 24] [--reps 3]

Prompts are the chat-formatted questions of ``benchmarks/rollout.py``, cut or extended to
``L - (i % 4)`` tokens (so rows are left-padded as in training); ``--max-new-tokens 24`` is
the quickstart's ``max_response_length``. One torch thread. The load average is printed
before and after: on a shared machine compare the ratios, not the times.

Measured with the defaults on the 2-core machine while it ran learning runs of others (load
average 12.5 -> 24.9: the times are not those of an idle machine, the ratios are per repeat):

    model            prompt  rows  tokens  off (s)  on (s)  off/on        range  same tokens
    quickstart 1.0M      34    64    1513    1.351   1.105    1.22    0.72-2.44  yes
    quickstart 1.0M     256    64    1492   13.526   6.713    2.06    2.01-2.74  yes
    20m 19.2M            34    64    1450   23.087   9.531    2.49    1.73-2.79  yes
    20m 19.2M           256    64    1450   68.952  24.180    3.75    2.62-6.09  yes

Log-probs identical (max |diff| 0.0) in every row. The quickstart's own loop (grpo.toml, 6
steps, seed 0) logs the same metrics with the lever on and off, every non-timing key equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rollout import TEXTS, build
from transformers import AutoTokenizer

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore_hf.rollout import HFRollout


def make_rows(path: str, length: int, prompts: int, n: int) -> DataProto:
    tok = AutoTokenizer.from_pretrained(path)
    filler = tok(" ".join(TEXTS))["input_ids"]
    rows = []
    for i in range(prompts):
        chat = tok.apply_chat_template(
            [{"role": "user", "content": f"{i}: {TEXTS[i % len(TEXTS)]}"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tok(chat)["input_ids"]
        want = length - (i % 4)
        while len(ids) < want:
            ids = filler[: want - len(ids)] + ids
        rows.append(ids[-want:])
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    input_ids = torch.full((prompts, length), pad)
    mask = torch.zeros((prompts, length), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, length - len(ids) :] = torch.tensor(ids)
        mask[i, length - len(ids) :] = 1
    batch = DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )
    return batch.repeat(n, interleave=True)


LEVERS = ("share_prompt_prefill", "share_prompt_kv", "inverse_cdf_sampling")


def bench(name: str, path: str, length: int, args: argparse.Namespace) -> dict:
    spec = RolloutSpec(model_path=path, max_response_length=args.max_new_tokens, seed=5)
    pinned = {"share_prompt_kv": False} if args.lever == "share_prompt_prefill" else {}
    rollouts = {
        on: HFRollout(spec, HFRollout.Config(**{args.lever: on, **pinned})) for on in (False, True)
    }
    rows = make_rows(path, length, args.prompts, args.n)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    # Log-probs: one call each (the rollouts' call counters stay in step: same seeds below).
    with_lp = SamplingParams(
        temperature=1.0, max_new_tokens=args.max_new_tokens, return_log_probs=True
    )
    lp = {s: r.generate(rows, with_lp).batch for s, r in rollouts.items()}
    lp_diff = float((lp[True]["rollout_log_probs"] - lp[False]["rollout_log_probs"]).abs().max())
    same = torch.equal(lp[True]["responses"], lp[False]["responses"])
    times: dict[bool, list[float]] = {False: [], True: []}
    tokens = 0
    for _ in range(args.reps):
        out = {}
        for share, rollout in rollouts.items():
            start = time.perf_counter()
            out[share] = rollout.generate(rows, sampling).batch
            times[share].append(time.perf_counter() - start)
        same &= torch.equal(out[True]["responses"], out[False]["responses"])
        tokens = int(out[True]["response_mask"].sum())
    ratios = [off / on for off, on in zip(times[False], times[True], strict=True)]
    n_params = sum(p.numel() for p in rollouts[True].model.parameters()) / 1e6
    return {
        "model": f"{name} {n_params:.1f}M",
        "length": length,
        "rows": len(rows),
        "tokens": tokens,
        "off": statistics.median(times[False]),
        "on": statistics.median(times[True]),
        "ratio": statistics.median(ratios),
        "spread": (min(ratios), max(ratios)),
        "same": None if args.lever == "inverse_cdf_sampling" else same,
        "lp_diff": None if args.lever == "inverse_cdf_sampling" else lp_diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lever", choices=LEVERS, default=LEVERS[0])
    ap.add_argument("--models", default="quickstart,20m")
    ap.add_argument("--prompt-lengths", default="34,256")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts per call")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = build(name, Path(tmp))
            for length in (int(x) for x in args.prompt_lengths.split(",")):
                results.append(bench(name, path, length, args))
    load_after = os.getloadavg()[0]
    print(
        f"\n{args.lever}: {args.prompts} prompts x n={args.n}, {args.max_new_tokens} "
        f"new tokens, temperature 1, float32, 1 thread; median of {args.reps} interleaved "
        f"repeats; load average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores\n"
    )
    print(
        f"{'model':<16}{'prompt':>7}{'rows':>6}{'tokens':>8}{'off (s)':>9}{'on (s)':>8}"
        f"{'off/on':>8}{'range':>13}  same tokens  max |lp diff|"
    )
    for r in results:
        lo, hi = r["spread"]
        same = {True: "yes", False: "NO", None: "n/a"}[r["same"]]
        lp_diff = "n/a" if r["lp_diff"] is None else f"{r['lp_diff']:.1e}"
        print(
            f"{r['model']:<16}{r['length']:>7}{r['rows']:>6}{r['tokens']:>8}{r['off']:>9.3f}"
            f"{r['on']:>8.3f}{r['ratio']:>8.2f}{f'{lo:.2f}-{hi:.2f}':>13}  "
            f"{same:<11}  {lp_diff}"
        )


if __name__ == "__main__":
    main()
