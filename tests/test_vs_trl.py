"""``benchmarks/vs_trl.py`` without a training run (the benchmark itself is run by hand, see its
docstring): the configs it writes load with its dense reward registered, the reward manager
built from the dense config scores each decoded response with the same ``vowel_share`` that
TRL's reward function runs, and a missing quickstart warm start is one line and exit 2."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch

from rlcore.config import load_config
from rlcore.protocol import DataProto
from rlcore.trainer.builder import build_reward_manager

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_trl.py"


@pytest.fixture(scope="module")
def vs_trl():
    spec = importlib.util.spec_from_file_location("vs_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = module  # its dataclass resolves annotations through it
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)  # puts benchmarks/ on sys.path, for step_flops
        yield module
    finally:
        del sys.modules["vs_trl"]
        sys.modules.pop("step_flops", None)
        sys.path[:] = path


def test_a_missing_warm_start_is_one_line_naming_the_command(vs_trl, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(vs_trl, "WARM_MODEL", tmp_path / "missing")
    assert vs_trl.main(["--no-trl", "--works", "dense", "warm"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "python examples/quickstart/prepare.py --seed 0" in out[0]


def test_a_missing_trained_real_model_is_one_line_naming_the_recipe(vs_trl, monkeypatch, capsys,
                                                                   tmp_path):  # fmt: skip
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    monkeypatch.setattr(vs_trl, "REAL_DATA", data)
    monkeypatch.setattr(vs_trl, "REAL_TRAINED", tmp_path / "missing")
    assert vs_trl.main(["--no-trl", "--works", "real-trained"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "bash examples/smollm2/run.sh" in out[0]


def test_vllm_columns_without_vllm_are_one_line_naming_the_command(vs_trl, capsys, tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"
    argv = ["--no-trl", "--works", "dense", "--vllm", "--vllm-python", str(missing)]
    assert vs_trl.main(argv) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert "bash scripts/test_vllm.sh" in out[0]


def test_the_vllm_overrides_load_with_the_rollout_correction(vs_trl, tmp_path):
    """The --vllm runs' config: vLLM's bfloat16 engine for the float32 policy, and with it
    rollout_is "token" by default (the plugin's Config loads without vLLM)."""
    (work,) = vs_trl.build(tmp_path, ["dense"], ["tiny"], [False])
    path = tmp_path / "vllm.toml"
    path.write_text(vs_trl.rlcore_config(work, tmp_path / "run", workers=1, steps=2))
    config = load_config(path, vs_trl.VLLM, registry=vs_trl.dense_reward_registry())
    assert (config.rollout.name, config.rollout.options.dtype) == ("vllm", "bfloat16")
    assert config.model.dtype == "float32"
    assert config.algorithm.options.rollout_is == "token"


def test_the_dense_reward_scores_the_text_trl_scores(vs_trl, tmp_path):
    from transformers import AutoTokenizer

    works = vs_trl.build(tmp_path, ["dense", "degenerate"], ["tiny"], [True])
    assert [(w.label, w.reward, w.kl) for w in works] == [
        ("dense, no ref", "vowels", False),
        ("DEGENERATE tiny, KL", "gsm8k", True),
    ]
    registry = vs_trl.dense_reward_registry()
    configs = {}
    for work in works:
        path = tmp_path / f"{work.reward}.toml"
        path.write_text(vs_trl.rlcore_config(work, tmp_path / "run", workers=2, steps=2))
        configs[work.reward] = load_config(path, registry=registry)
    assert configs["gsm8k"].algorithm.options.use_kl_loss
    assert list(configs["vowels"].reward.default) == [vs_trl.DENSE_REWARD]

    # The decoded responses (special tokens skipped), scored by the reward manager the run
    # builds from the dense config: rlcore's scorer against the function TRL's script runs.
    tokenizer = AutoTokenizer.from_pretrained(works[0].model)
    texts = ["aXe io", "xyz", "", "héllo <|im_end|>"]
    eos = tokenizer.eos_token_id
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    width = max(map(len, ids))
    responses = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    prompts = torch.full((len(ids), 2), tokenizer.pad_token_id)
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([torch.ones_like(prompts), mask], 1),
            "response_mask": mask,
        },
        non_tensors={
            "data_source": ["arithmetic"] * len(ids),
            "reward_model": [{"style": "rule", "ground_truth": "0"}] * len(ids),
        },
    )
    manager = build_reward_manager(configs["vowels"], tokenizer, registry=registry)
    try:
        out, _ = manager(data)
    finally:
        manager.close()
    trl_side: dict = {}
    exec(inspect.getsource(vs_trl.vowel_share), trl_side)  # what TRL_SCRIPT is prefixed with
    decoded = ["aXe io", "xyz", "", "héllo "]  # the EOS and the special token are skipped
    expected = [trl_side["vowel_share"](t) for t in decoded]
    assert expected == [4 / 6, 0.0, 0.0, 1 / 6]
    assert list(out.non_tensor_batch["score"]) == pytest.approx(expected)


def test_the_report_prints_each_table_with_its_ratios(vs_trl, capsys, tmp_path):
    """The tables from runs' medians: rlcore/TRL per column, each repeat's ratio min-max."""
    (work,) = vs_trl.build(tmp_path, ["dense"], ["tiny"], [False])

    def rlcore(step, gen):
        return {"timing_s/step": step, "timing_s/gen": gen, "rollout/logprob_diff_mean": 0.002}

    res = {
        "trl": [{"step": 2.0}, {"step": 2.0}],
        "after": [rlcore(1.0, 0.5), rlcore(1.2, 0.5)],
        "trl-2t": [{"step": 1.0}, {"step": 1.0}],
        "after-2w": [rlcore(0.5, 0.2), rlcore(0.5, 0.2)],
        "vllm": [rlcore(1.5, 0.7), rlcore(1.7, 0.7)],
    }
    vs_trl.report({work.label: res}, {work.label: work})
    lines = capsys.readouterr().out.splitlines()
    main, vllm = (lines[i + 1] for i, line in enumerate(lines) if line.startswith("work"))
    assert main.split()[-8:] == ["2.00", "1.10", "0.55", "(0.50-0.60)", "1.00", "0.50", "0.50",
                                 "(0.50-0.50)"]  # fmt: skip
    # no 2-worker vLLM run: those cells are "-"; then generation and |dlogp|
    assert vllm.split()[-9:] == ["2", "1.6", "0.80", "(0.75-0.85)", "1", "-", "-", "0.7", "0.002"]


def test_the_flop_count_equals_torch_flop_counter_on_a_real_model(vs_trl, tmp_path):
    """``benchmarks/step_flops.py`` against ``FlopCounterMode`` on the dense row's model: a
    training forward+backward (3 forwards) and a ``generate`` (prefill, then one forward per
    later token), exactly. Eager attention, so the counter sees its matmuls; eager computes
    every query against every key of a prefill, where the FLOP model counts the causal half."""
    from step_flops import ModelShape, StepWork, causal_keys, step_flops
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    (work,) = vs_trl.build(tmp_path, ["dense"], ["tiny"], [False])
    model = AutoModelForCausalLM.from_pretrained(work.model, attn_implementation="eager")
    shape = ModelShape.from_config(work.model)
    rows, length, new = 4, 24, 10
    ids = torch.randint(3, shape.vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    square = rows * length * length  # every query against every key

    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids).logits.sum().backward()
    assert counter.get_total_flops() == 3 * shape.forward(rows * length, square, rows * length)

    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                       max_new_tokens=new, min_new_tokens=new, pad_token_id=0)  # fmt: skip
    work_flops = step_flops(shape, StepWork(groups=rows, n=1, prompt=length, response=new,
                                            longest=new, shared_prefill=False,
                                            shared_prompts=False))  # fmt: skip
    causal_prefill = rows * causal_keys(length)
    prefill_square = shape.layers * 4 * shape.q_width * (square - causal_prefill)
    assert counter.get_total_flops() == work_flops["generate"] + prefill_square


def test_shared_prompts_save_exactly_the_repeated_prompts(vs_trl):
    """One prompt per group instead of n: the saving is n - 1 prompt passes per group (their
    matmuls and attention), nothing else; skipped groups leave the update only."""
    from step_flops import ModelShape, StepWork, causal_keys, step_flops

    shape = ModelShape(layers=2, hidden=128, q_width=128, kv_width=64, intermediate=256, vocab=259)
    base = dict(groups=16, n=8, prompt=40, response=20, longest=30, checkpointing=False)
    plain = step_flops(shape, StepWork(shared_prefill=False, shared_prompts=False, **base))
    shared = step_flops(shape, StepWork(shared_prefill=True, shared_prompts=True, **base))
    repeated = 16 * 7  # prompt passes saved
    prompt_pass = shape.decoder_forward(40, causal_keys(40))
    assert plain["generate"] - shared["generate"] == pytest.approx(
        repeated * (prompt_pass + 2 * shape.hidden * shape.vocab)  # the prefill's last logits
    )
    assert plain["update"] - shared["update"] == pytest.approx(3 * repeated * prompt_pass)
    half = step_flops(shape, StepWork(shared_prefill=True, shared_prompts=True,
                                      trained_share=0.5, reference=True, **base))  # fmt: skip
    assert half["generate"] == shared["generate"]
    assert half["update"] == pytest.approx(shared["update"] / 2)
    assert half["reference"] == pytest.approx(shared["update"] / 3)  # one forward of all


def test_the_report_prints_both_frameworks_flops(vs_trl, capsys, tmp_path):
    (work,) = vs_trl.build(tmp_path, ["dense"], ["tiny"], [False])
    rlcore = {"timing_s/step": 1.0, "prompt_length/mean": 30.0, "response_length/mean": 60.0,
              "response_length/max": 64.0, "actor/skipped_rows_frac": 0.0}  # fmt: skip
    res = {"trl": [{"step": 2.0, "length": 60.0, "longest": 64.0}], "after": [rlcore]}
    gflops = vs_trl.step_gflops(work, res)
    assert gflops["rlcore"]["total"] < gflops["trl"]["total"]
    assert gflops["rlcore"]["reference"] == gflops["trl"]["reference"] == 0.0
    vs_trl.report({work.label: res}, {work.label: work})
    out = capsys.readouterr().out
    ratio = gflops["rlcore"]["total"] / gflops["trl"]["total"]
    assert f"FLOP ratio rlcore/TRL {ratio:.2f}" in out
    # the rates: FLOPs over each 1-thread step (TRL 2 s, rlcore 1 s), and rlcore's at 0.5 x 2 s
    ours, theirs = gflops["rlcore"]["total"], gflops["trl"]["total"]
    assert (
        f"FLOP rates at 1 thread: TRL {theirs / 2:.1f} GFLOP/s, rlcore {ours:.1f}; rlcore/TRL "
        f"0.5 needs rlcore at {ours:.1f} GFLOP/s over the whole step"
    ) in out
    matmul = float(out.split("matmul on the model's MLP shape: ")[1].split()[0])
    assert matmul > 0.5  # measured here: any CPU multiplies faster than that


def test_the_phase_table_judges_the_overlap_by_its_longer_side(vs_trl, capsys):
    # a synchronous run: the step is the phases' sum, so the share outside them is the measure;
    # the overlap: generation runs beside the update, so a negative "outside" share would print
    w = "timing_s/worker/"
    sync = {"timing_s/step": 1.0, w + "generate": 0.3, w + "actor_forward_backward": 0.6,
            w + "actor_optimizer": 0.05}  # fmt: skip
    overlap = {"timing_s/step": 0.66, w + "generate": 0.4, w + "actor_forward_backward": 0.55,
               w + "actor_optimizer": 0.05, "actor/skipped_rows_frac": 0.25}  # fmt: skip
    vs_trl.phase_table({"after": sync, "overlap": overlap})
    out = capsys.readouterr().out
    assert "after: outside-compute share 5.0% (goal <= 5%), skipped rows 0%" in out
    assert (
        "overlap: step / max(generation, update) 1.10 (generation 0.400 s, update 0.600 s; "
        "goal <= 1.15), skipped rows 25%"
    ) in out
    assert "overlap: outside-compute" not in out


def test_trls_flexible_rule_is_the_gsm8k_plugins_rule(vs_trl):
    """The real row's TRL script scores with the gsm8k plugin's own extraction (its source)."""
    from rlcore_gsm8k.reward import compute_score

    trl_side: dict = {}
    exec(vs_trl.gsm8k_flexible_source(), trl_side)
    for text, truth in [("The answer is 42", "42"), ("17.", "17"), ("12 + 5 = 17", "17"),
                        ("1,234", "1234"), ("no number", "3"), ("-4 or 4", "4")]:  # fmt: skip
        theirs = float(
            trl_side["extract_solution"](text, "flexible") == trl_side["normalize_answer"](truth)
        )
        assert theirs == compute_score(text, truth, method="flexible")


def test_the_report_says_what_happened_to_trls_best_settings(vs_trl, capsys, tmp_path):
    (work,) = vs_trl.build(tmp_path, ["dense"], ["tiny"], [False])
    run = {"timing_s/step": 1.0, "timing_s/gen": 0.4, "perf/mfu/update": 0.5,
           "critic/score/mean": 0.2, "critic/score/min": 0.0, "critic/score/max": 0.9}  # fmt: skip
    res = {
        "trl": [{"step": 2.0, "reward": 0.3}],
        "trl-compile": [{"step": 2.5}],
        "trl-vllm": [{"failed": "AttributeError: no weight_loader"}],
        "after": [run],
        "compiled": [{"timing_s/step": 0.8, "compile_s_total": 9.0, "compile_mode": "both"}],
    }
    vs_trl.report({work.label: res}, {work.label: work})
    out = capsys.readouterr().out
    assert (
        "rlcore 1w compiled (rollout.compile_decode=true actor.compile=true): 0.80 s/step after "
        "9 s of update compiles in the warm-up; rlcore compiled / TRL 0.40 (0.40-0.40), / TRL "
        "compiled 0.32 (0.32-0.32)"
    ) in out
    assert "TRL vLLM mode (colocate) did not run: AttributeError: no weight_loader" in out
    assert "torch_compile=True: 2.50 s/step (eager 2.00); rlcore 1w / TRL compiled 0.40" in out
    assert "update 0.50, generation -" in out
    assert "rewards: rlcore 1w mean 0.20, min 0.00, max 0.90; TRL 1t mean 0.30" in out
