"""LoRA end to end: a GRPO run with a KL loss whose reference is the actor with adapters off,
then ``rlcore export --lora merged|adapter`` of its checkpoint (transformers / peft load it).

Real Ray workers, the FSDP2 engine with ``lora_rank = 8``, the HF rollout (merged weight sync).
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs the extra: pip install 'rlcore-fsdp2[lora]'")
pytestmark = pytest.mark.slow

LORA = """
[actor.engine]
name = "fsdp2"
lora_rank = 8
lora_alpha = 16
"""


def test_lora_grpo_with_kl_then_both_exports(ray_session, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlcore.cli import main
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    write_jsonl(arithmetic_rows([(a, b) for a in range(4) for b in range(4)]), tmp_path / "t.jsonl")
    run_dir = tmp_path / "run"
    text = tiny_run_toml(
        model=model,
        train_files=[tmp_path / "t.jsonl"],
        run_dir=run_dir,
        algorithm_options='use_kl_loss = true\nkl_loss_coef = 0.1\nkl_loss_type = "k2"\n'
        # a random model scores 0 on every prompt: the entropy bonus moves the adapters
        "entropy_coeff = 0.5",
        total_steps=2,
        lr=5e-2,
        extra=LORA,
    )
    config = load_config_text(text, source="lora.toml")
    assert config.actor.engine.options.lora_rank == 8
    assert config.ref.engine == config.actor.engine  # no separate reference configured
    assert run_training(config) == 0

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "actor/kl_loss" in r]
    assert len(train) == 2
    # Step 1: lora_B is still zero, so the actor *is* the base model and the reference (the
    # same engine, adapters off) agrees to the bit. Step 2: the adapters moved; KL > 0.
    assert train[0]["actor/kl_loss"] == 0.0
    assert train[1]["actor/kl_loss"] > 0.0
    assert "timing_s/ref" in train[1]

    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", str(run_dir), str(merged_dir)]) == 0
    assert main(["export", str(run_dir), str(adapter_dir), "--lora", "adapter"]) == 0
    capsys.readouterr()
    assert (adapter_dir / "adapter_config.json").is_file()
    assert not (merged_dir / "adapter_config.json").exists()

    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    base = AutoModelForCausalLM.from_pretrained(model)
    adapted = PeftModel.from_pretrained(base, adapter_dir).eval()
    ids = torch.randint(3, 250, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        lm, la = merged(input_ids=ids).logits, adapted(input_ids=ids).logits
        with adapted.disable_adapter():
            lb = adapted(input_ids=ids).logits
    assert (lm - la).abs().max() < 1e-5
    assert (lm - lb).abs().max() > 1e-4  # the export carries the trained adapters

    # --lora adapter of a run without adapters: one line naming the reason
    full = tmp_path / "full"
    config = load_config_text(
        tiny_run_toml(model=model, train_files=[tmp_path / "t.jsonl"], run_dir=full, total_steps=1),
        source="full.toml",
    )
    assert run_training(config) == 0
    assert main(["export", str(full), str(tmp_path / "x"), "--lora", "adapter"]) == 2
    err = capsys.readouterr().err
    assert "cannot export a LoRA adapter folder" in err
    assert "lora_rank = 0" in err
