"""rlcore against TRL's GRPOTrainer on the same GRPO work, interleaved (issue 16).

    python benchmarks/vs_trl.py                      # full table: both models, +/- KL, 2 repeats
    python benchmarks/vs_trl.py --models tiny --repeats 3   # the README's tiny rows
    python benchmarks/vs_trl.py --models tiny --steps 1 --repeats 1 --no-trl   # smoke
    python benchmarks/vs_trl.py --models 17m --kl off --steps 3 --no-before    # the 17m row
    python benchmarks/vs_trl.py --dtype bfloat16     # both in bf16 (TRL autocast, rlcore FSDP2 MP)

Both frameworks train the same random-init Qwen2 models (built here with
``rlcore.testing.tiny_model.build_tiny_model``): "tiny" (hidden 128, 2 layers, tied, about
0.33 M parameters) and "17m" (hidden 512, 6 layers, 8 heads). Work per step: 16 prompts x 8
samples, temperature 1, 64 new tokens (a random model fills every response to the limit),
one optimizer step, lr 1e-5, gradient checkpointing on (TRL's default), one thread per
process. With ``--kl`` variants a reference model adds a KL loss (beta 0.04).

Runs, interleaved per repeat and model: TRL, rlcore with issue 16's levers off ("before":
``actor.reuse_on_policy_log_probs=false actor.skip_zero_advantage_rows=false
actor.engine.log_prob_chunk_tokens=0 actor.engine.share_prompts=false
actor.engine.use_remove_padding=false``; the reference
engine inherits the actor's options), rlcore with the defaults ("after"), and rlcore
with 2 workers x 1 thread. Each run does one warm-up step (left out) and ``--steps``
measured ones. Printed: s/step, tokens/s, generation share, per-phase tables, rlcore/TRL.

TRL is installed by this script into its own virtual environment (``--trl-venv``, default
/tmp/trl-venv) with this environment's torch and transformers pinned through a constraints
file; where that fails (no registry), TRL is skipped with a message. Timings are only
meaningful on a quiet machine: the load average is printed next to the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

MODELS = {
    "tiny": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "tie_word_embeddings": True},
    "17m": {"hidden": 512, "layers": 6, "heads": 8, "kv_heads": 8, "tie_word_embeddings": False},
}
PROMPTS, N, NEW_TOKENS, LR, BETA = 16, 8, 64, 1e-5, 0.04
LEVERS_OFF = [
    "actor.reuse_on_policy_log_probs=false",
    "actor.skip_zero_advantage_rows=false",
    "actor.engine.log_prob_chunk_tokens=0",
    "actor.engine.share_prompts=false",
    "actor.engine.use_remove_padding=false",
]
WORKER_PHASES = (
    "generate",
    "actor_forward",
    "ref_forward",
    "actor_forward_backward",
    "actor_optimizer",
    "weight_sync",
)
COMPUTE = WORKER_PHASES[:-1]

# --- data and models ----------------------------------------------------------------------


def prompts() -> list[dict]:
    pairs = [(a, b) for a in range(20) for b in range(20)]
    return [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate(pairs)
    ]


def build(root: Path, models: list[str]) -> dict[str, Path]:
    from rlcore.testing.tiny_model import build_tiny_model

    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts()))
    return {name: build_tiny_model(root / name, **MODELS[name]) for name in models}


def param_count(path: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())


# --- rlcore ---------------------------------------------------------------------------------


def rlcore_config(root: Path, model: Path, run: Path, *, kl: bool, workers: int, steps: int) -> str:
    kl_keys = f'use_kl_loss = true\nkl_loss_coef = {BETA}\nkl_loss_type = "low_var_kl"\n'
    return f"""
[data]
train_files = ["{root / "train.jsonl"}"]
max_prompt_length = 64
max_response_length = {NEW_TOKENS}
train_batch_size = {PROMPTS}

[model]
path = "{model}"

[actor]
ppo_mini_batch_size = {PROMPTS}
micro_batch_size = {PROMPTS * N // workers}
gradient_checkpointing = true
optim = {{ lr = {LR} }}

[ref]
micro_batch_size = {PROMPTS * N // workers}

[rollout]
name = "hf"
n = {N}
temperature = 1.0

[reward]
default = ["gsm8k"]

[algorithm]
name = "grpo"
{kl_keys if kl else ""}
[trainer]
total_steps = {steps}
val_before_train = false
test_freq = 0
loggers = ["jsonl"]
run_dir = "{run}"

[resources]
processes_per_node = {workers}
"""


def run_rlcore_child(config_path: str, overrides: list[str]) -> None:
    """In a fresh process: one Ray session, one training run (``--child``)."""
    import ray

    from rlcore.config import load_config
    from rlcore.trainer import run_training
    from rlcore.workers.cluster import start_ray

    config = load_config(config_path, overrides)
    start_ray(config.resources)
    try:
        run_training(config)
    finally:
        ray.shutdown()


def rlcore_run(root: Path, tag: str, model: Path, *, kl: bool, workers: int, steps: int,
               overrides: list[str]) -> dict[str, float]:  # fmt: skip
    run = root / f"run-{tag}"
    cfg = root / f"{tag}.toml"
    cfg.write_text(rlcore_config(root, model, run, kl=kl, workers=workers, steps=steps + 1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", str(cfg), *overrides]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) > 1]  # the warm-up step is left out
    keys = {k for r in rows for k, v in r.items() if isinstance(v, int | float)}
    return {k: statistics.median(r[k] for r in rows if k in r) for k in keys}


# --- TRL --------------------------------------------------------------------------------------

TRL_SCRIPT = r"""
import json, re, sys, time
import torch
torch.set_num_threads(1)
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
import dataclasses

model_path, data_path, steps, beta, lr, n, prompts_per_step, new_tokens, out, dtype = sys.argv[1:11]
steps, n, prompts_per_step, new_tokens = int(steps), int(n), int(prompts_per_step), int(new_tokens)
rows = [json.loads(x) for x in open(data_path)]
ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]}
                        for r in rows])

def reward(completions, answer, **kw):
    out = []
    for c, a in zip(completions, answer):
        text = c[0]["content"] if isinstance(c, list) else c
        m = re.findall(r"#### (\-?[0-9\.\,]+)", text)
        out.append(1.0 if m and m[-1].replace(",", "") == a else 0.0)
    return out

fields = {f.name for f in dataclasses.fields(GRPOConfig)}
wanted = dict(output_dir=out + "/trl-out", per_device_train_batch_size=prompts_per_step * n,
              gradient_accumulation_steps=1, num_generations=n, max_completion_length=new_tokens,
              max_prompt_length=64, temperature=1.0, learning_rate=float(lr), beta=float(beta),
              num_iterations=1, gradient_checkpointing=True, use_cpu=True, bf16=dtype == "bfloat16",
              max_steps=steps + 1, logging_steps=1, report_to=[], save_strategy="no",
              lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
              dataloader_num_workers=0, seed=0)
args = GRPOConfig(**{k: v for k, v in wanted.items() if k in fields})
tok = AutoTokenizer.from_pretrained(model_path)
model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                      processing_class=tok)
times, gen = [], []
for name in ("_generate_and_score_completions",):
    if hasattr(trainer, name):
        orig = getattr(trainer, name)
        def timed(*a, _orig=orig, **k):
            t = time.perf_counter(); r = _orig(*a, **k); gen.append(time.perf_counter() - t)
            return r
        setattr(trainer, name, timed)

class Clock(TrainerCallback):
    def on_step_begin(self, *a, **k): self.t = time.perf_counter()
    def on_step_end(self, *a, **k): times.append(time.perf_counter() - self.t)

trainer.add_callback(Clock())
trainer.train()
lengths = [h["completions/mean_length"] for h in trainer.state.log_history
           if "completions/mean_length" in h]
json.dump({"step": times, "gen": gen, "lengths": lengths}, open(out + "/trl.json", "w"))
"""


def trl_python(venv: Path) -> Path | None:
    """The TRL venv's python, creating it on first use; None (with a message) if impossible."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import trl"]).returncode == 0:
        return python
    pins = [f"{name}=={metadata.version(name)}" for name in ("torch", "transformers")]
    constraints = venv.parent / f"{venv.name}-constraints.txt"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        constraints.write_text("\n".join(pins) + "\n")
        subprocess.run([python, "-m", "pip", "install", "-q", pins[0]], check=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "-c", str(constraints), "trl", "datasets",
             pins[1]],
            check=True,
        )  # fmt: skip
    except subprocess.CalledProcessError as err:
        print(f"TRL skipped: could not install it into {venv} ({err})")
        return None
    return python


def trl_run(
    python: Path, root: Path, tag: str, model: Path, *, kl: bool, steps: int, dtype: str
) -> dict:
    out = root / f"trl-{tag}"
    out.mkdir(exist_ok=True)
    script = root / "trl_grpo.py"
    script.write_text(TRL_SCRIPT)
    beta = BETA if kl else 0.0
    args = [model, root / "train.jsonl", steps, beta, LR, N, PROMPTS, NEW_TOKENS, out, dtype]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    subprocess.run([python, script, *map(str, args)], check=True, env=env,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    raw = json.loads((out / "trl.json").read_text())
    step, gen = raw["step"][1:], raw["gen"][1:]  # the warm-up step is left out
    lengths = raw.get("lengths") or [float("nan")]
    return {
        "step": statistics.median(step),
        "gen": statistics.median(gen) if gen else None,
        "length": statistics.median(lengths),  # mean completion length: same work as rlcore?
    }


# --- tables ---------------------------------------------------------------------------------


def phase_table(runs: dict[str, dict[str, float]]) -> None:
    names = list(runs)
    print(f"{'phase (median s)':<30}" + "".join(f"{n:>14}" for n in names))
    rows = [("step", "timing_s/step"), ("gen (driver)", "timing_s/gen"),
            ("old_log_prob (driver)", "timing_s/old_log_prob"), ("ref (driver)", "timing_s/ref"),
            ("update_actor (driver)", "timing_s/update_actor")]  # fmt: skip
    rows += [(f"  worker/{p}", f"timing_s/worker/{p}") for p in WORKER_PHASES]
    for label, key in rows:
        cells = [runs[n].get(key) for n in names]
        if any(c is not None for c in cells):
            print(f"{label:<30}" + "".join(f"{c:>14.3f}" if c is not None else f"{'-':>14}"
                                           for c in cells))  # fmt: skip
    for n in names:
        m = runs[n]
        step = m.get("timing_s/step", float("nan"))
        compute = sum(m.get(f"timing_s/worker/{p}", 0.0) for p in COMPUTE)
        print(f"{n}: outside-compute share {100 * (step - compute) / step:.1f}% (goal <= 5%), "
              f"skipped rows {100 * m.get('actor/skipped_rows_frac', 0.0):.0f}%")  # fmt: skip


def degenerate(res: dict) -> bool:
    """Every sampled reward of every rlcore run 0: all advantages 0, the backward skippable."""
    highs = [r.get("critic/score/max") for runs in res.values() for r in runs]
    highs = [h for h in highs if h is not None]
    return bool(highs) and max(highs) == 0.0


def med_of(res: dict, label: str, key: str) -> float | None:
    vals = [r[key] for r in res.get(label, []) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    # The first steps after the warm-up can still run slow (rlcore's steps 2-4 took up to
    # 1.4x the later ones here), so a short run over-weights them.
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats")
    parser.add_argument("--kl", choices=("off", "on", "both"), default="both")
    parser.add_argument("--no-trl", action="store_true", help="rlcore only")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: rlcore [model] dtype (FSDP2 mixed precision, float32 master weights) "
        "against TRL's bf16=True (autocast)",
    )
    parser.add_argument("--no-two-workers", action="store_true")
    parser.add_argument(
        "--no-before",
        action="store_true",
        help="leave out rlcore with the levers off (the slow variant on the 17m model)",
    )
    parser.add_argument("--trl-venv", default="/tmp/trl-venv")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        run_rlcore_child(args.child, rest)
        return 0

    python = None if args.no_trl else trl_python(Path(args.trl_venv))
    kls = {"off": [False], "on": [True], "both": [False, True]}[args.kl]
    results: dict[tuple[str, bool], dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = build(root, args.models)
        for name, path in models.items():
            print(f"model {name}: {param_count(path) / 1e6:.2f} M parameters")
        for rep in range(args.repeats):
            for name, path in models.items():
                for kl in kls:
                    tag = f"{name}-{'kl' if kl else 'nokl'}-{rep}"
                    res = results.setdefault((name, kl), {})
                    if python is not None:
                        trl = trl_run(
                            python, root, tag, path, kl=kl, steps=args.steps, dtype=args.dtype
                        )
                        res.setdefault("trl", []).append(trl)
                    variants = [("after", 1, [])]
                    if not args.no_before:
                        variants.insert(0, ("before", 1, LEVERS_OFF))
                    if not args.no_two_workers:
                        variants.append(("after-2w", 2, []))
                    for label, workers, overrides in variants:
                        overrides = [*overrides, f"model.dtype={args.dtype}"]
                        res.setdefault(label, []).append(rlcore_run(
                            root, f"{tag}-{label}", path, kl=kl, workers=workers,
                            steps=args.steps, overrides=overrides))  # fmt: skip
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    tokens = PROMPTS * N * NEW_TOKENS
    print(f"\n{'work':<22}{'TRL s/step':>12}{'before':>10}{'after':>10}{'after 2w':>10}"
          f"{'after/TRL':>11}{'tok/s':>9}{'gen %':>8}{'TRL gen %':>10}")  # fmt: skip
    for (name, kl), res in results.items():

        def med(label: str, key: str = "timing_s/step", res: dict = res) -> float | None:
            vals = [r[key] for r in res.get(label, []) if r.get(key) is not None]
            return statistics.median(vals) if vals else None

        trl = statistics.median(r["step"] for r in res["trl"]) if "trl" in res else None
        trl_gen = [r["gen"] for r in res.get("trl", []) if r["gen"] is not None]
        after = med("after")
        cells = [trl, med("before"), after, med("after-2w")]
        ratio = f"{after / trl:.2f}" if trl and after else "-"
        gen = med("after", "timing_s/gen")
        gen_share = f"{100 * gen / after:.0f}" if gen and after else "-"
        trl_share = f"{100 * statistics.median(trl_gen) / trl:.0f}" if trl_gen and trl else "-"
        work = f"{name}, {'KL' if kl else 'no ref'}" + (" *" if degenerate(res) else "")
        print(
            f"{work:<22}"
            + "".join(f"{c:>10.2f}" if c else f"{'-':>10}" for c in cells[:1])
            + "".join(f"{c:>10.2f}" if c else f"{'-':>10}" for c in cells[1:])
            + f"{ratio:>11}{tokens / after if after else 0:>9.0f}{gen_share:>8}{trl_share:>10}"
        )
    for (name, kl), res in results.items():
        # The spread: each repeat's rlcore run against the TRL run it was interleaved with.
        pairs = zip(res.get("trl", []), res.get("after", []), strict=False)
        ratios = [a["timing_s/step"] / t["step"] for t, a in pairs if a.get("timing_s/step")]
        if ratios:
            print(
                f"{name}, {'KL' if kl else 'no ref'}: after/TRL per repeat "
                + " ".join(f"{r:.2f}" for r in ratios)
                + f" (min {min(ratios):.2f}, max {max(ratios):.2f})"
            )
    for (name, kl), res in results.items():
        skipped = med_of(res, "after", "actor/skipped_rows_frac")
        print(
            f"{name}, {'KL' if kl else 'no ref'}: skipped rows (zero advantage) rlcore "
            f"{100 * (skipped or 0.0):.0f}%, TRL 0% (it computes every row)"
            + ("; * DEGENERATE: every reward 0 (random-init model), so the ratio measures "
               "skipped work, not the same work" if degenerate(res) else "")
        )  # fmt: skip
    for (name, kl), res in results.items():
        if "trl" in res:
            trl_len = statistics.median(r["length"] for r in res["trl"])
            ours = med_of(res, "after", "response_length/mean")
            print(
                f"{name}, {'KL' if kl else 'no ref'}: mean response length TRL {trl_len:.1f}, "
                f"rlcore {ours if ours is not None else float('nan'):.1f} "
                f"(limit {NEW_TOKENS}; should match)"
            )
    for (name, kl), res in results.items():
        print(f"\n--- rlcore per phase: {name}, {'KL' if kl else 'no ref'} (medians of repeats)")
        merged = {}
        for label, runs in res.items():
            if label == "trl":
                continue
            keys = {k for r in runs for k in r}
            merged[label] = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
        phase_table(merged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
