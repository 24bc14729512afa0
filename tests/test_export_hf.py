"""``rlcore export``: a trained FSDP2 checkpoint -> a transformers folder, same greedy text."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from rlcore.checkpoint import ACTOR_DIR, CONFIG_FILE, CheckpointManager
from rlcore.cli import main
from rlcore.config import config_to_dict, dump_toml, load_config_text
from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto

torch.set_num_threads(1)

CONFIG = """
[data]
train_files = "train.jsonl"
train_batch_size = 4

[model]
path = "{model}"

[actor.engine]
name = "fsdp2"
reshard_after_forward = false

[reward]
default = "gsm8k"
"""

PROMPTS = ["What is 3 + 4?", "Name a colour.", "Count to five:"]
MAX_NEW = 12


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", hidden=64, heads=2, kv_heads=1
    )


def prompt_batch(tokenizer) -> DataProto:
    """Left-padded chat prompts (B, P) as the dataloader builds them."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in PROMPTS
    ]
    enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


def train_batch(rows: int = 6, prompt: int = 5, response: int = 4) -> DataProto:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1),
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def pg_loss(outputs, mb, totals):
    mask = mb.batch["response_mask"].float()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def test_export_loads_in_transformers_and_generates_the_engines_greedy_text(tiny, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore_fsdp2.engine import FSDP2Engine
    from rlcore_hf.rollout import HFRollout

    # --- train one step, so the weights differ from the base model
    spec = EngineSpec(
        role="actor", model_path=str(tiny), optim=OptimConfig(lr=5e-2), micro_batch_size=3
    )
    engine = FSDP2Engine(spec, FSDP2Engine.Config(reshard_after_forward=False))
    engine.forward_backward(train_batch(), pg_loss, temperature=1.0)
    engine.optimizer_step(lr=5e-2)
    trained = {n: t.clone() for n, t in engine.named_parameters_for_sync()}
    base = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    assert any(not torch.equal(trained[n], base[n]) for n in base)

    # --- a checkpoint laid out as the trainer writes it
    config = load_config_text(CONFIG.format(model=tiny))

    def write(step_dir):
        engine.save_checkpoint(str(step_dir / ACTOR_DIR))
        (step_dir / CONFIG_FILE).write_text(dump_toml(config_to_dict(config)))

    run_dir = tmp_path / "run"
    CheckpointManager(run_dir / "checkpoints").save(1, write)

    # --- the engine's greedy text: the HF rollout after weight sync, as training validates
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    prompts = prompt_batch(tokenizer)
    rollout = HFRollout(RolloutSpec(model_path=str(tiny), max_response_length=MAX_NEW))
    rollout.update_weights(engine.named_parameters_for_sync())
    greedy = SamplingParams(max_new_tokens=MAX_NEW, do_sample=False)
    expected = rollout.generate(prompts, greedy)
    log_probs = engine.compute_log_prob(expected, temperature=1.0).log_probs  # (B, R)

    # --- export a run directory (its latest checkpoint), as a fresh process would: the
    # export makes its own one-rank group and tears it down
    dist.destroy_process_group()
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--format", "hf", str(out)]) == 0
    assert not dist.is_initialized()
    assert capsys.readouterr().out == f"exported {run_dir} to {out}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]  # no temp folder left

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    exported_tok = AutoTokenizer.from_pretrained(out)
    assert exported_tok.chat_template == tokenizer.chat_template
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], atol=0, rtol=0, msg=name)

    with torch.no_grad():
        seqs = model.generate(
            input_ids=prompts.batch["input_ids"],
            attention_mask=prompts.batch["attention_mask"],
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    resp = seqs[:, prompts.batch["input_ids"].shape[1] :]
    mask = expected.batch["response_mask"].bool()
    assert mask.sum() > len(PROMPTS)  # real text, not just an immediate EOS
    for i in range(len(PROMPTS)):
        want = expected.batch["responses"][i][mask[i]]
        assert tokenizer.decode(resp[i][: len(want)]) == tokenizer.decode(want)
        assert torch.equal(resp[i][: len(want)], want)

    # --- and the same log-probabilities of those responses as the engine computes
    with torch.no_grad():
        logits = model(
            input_ids=expected.batch["input_ids"],
            attention_mask=expected.batch["attention_mask"],
            position_ids=expected.batch["position_ids"],
        ).logits
    width = expected.batch["responses"].shape[1]
    logp = torch.log_softmax(logits[:, -width - 1 : -1].float(), dim=-1)
    logp = logp.gather(-1, expected.batch["responses"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp * mask, log_probs * mask, atol=1e-5, rtol=1e-5)

    # --- a bf16 export of the step directory itself: the float32 weights, rounded
    step_dir = run_dir / "checkpoints" / "global_step_1"
    argv = ["export", str(step_dir), str(tmp_path / "bf16"), "--dtype", "bfloat16"]
    assert main(argv) == 0
    half = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto")
    for name, tensor in half.state_dict().items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, trained[name].to(torch.bfloat16)), name


# --- errors: one line, exit code 2 -------------------------------------------------------------


def run_err(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    return err


def test_export_errors_are_one_line(tmp_path, capsys):
    missing = tmp_path / "nope"
    out = tmp_path / "out"
    assert run_err(["export", str(missing), str(out)], capsys) == (
        f"error: checkpoint {missing} does not exist\n"
    )
    step = tmp_path / "global_step_3"
    step.mkdir()
    (step / "COMPLETE").write_text("{}")
    (step / "trainer_state.json").write_text('{"step": 3, "dataloader": {}}')
    # A real (tiny) DCP directory: the export verifies the checkpoint before reading config.
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(step / ACTOR_DIR), no_dist=True)
    assert run_err(["export", str(step), "--format", "gguf", str(out)], capsys) == (
        "error: unknown export format 'gguf'; available: hf\n"
    )
    assert run_err(["export", str(step), str(out)], capsys) == (
        f"error: checkpoint {step} has no config.toml (the resolved run config the trainer "
        "writes next to actor/); copy the run's config.toml into it\n"
    )
    (step / CONFIG_FILE).write_text('[model]\npath = "/no/such/model"\n')
    assert run_err(["export", str(step), str(out)], capsys) == (
        f"error: model.path /no/such/model (from {step / CONFIG_FILE}) has no config.json: the "
        "export needs the run's base model folder; pass --model-path\n"
    )
    (step / CONFIG_FILE).write_text(
        '[model]\npath = "/m"\n[actor.engine]\nname = "fsdp2"\nreshard_after_forwrd = 1\n'
    )
    assert run_err(["export", str(step), str(out)], capsys) == (
        f"error: {step / CONFIG_FILE}: actor.engine.reshard_after_forwrd: unknown key "
        "(did you mean 'reshard_after_forward'?)\n"
    )
    out.mkdir()
    (out / "x").write_text("keep me")
    assert run_err(["export", str(step), str(out)], capsys) == (
        f"error: output {out} exists and is not empty; choose a new folder or pass --overwrite\n"
    )
    assert run_err(["export", str(step)], capsys) == (
        "error: export: the following arguments are required: OUT "
        "(usage: rlcore export CHECKPOINT --format hf OUT)\n"
    )
    import shutil

    shutil.rmtree(step / ACTOR_DIR)
    assert run_err(["export", str(step), str(tmp_path / "o2")], capsys) == (
        f"error: checkpoint {step} has no actor/ directory (the actor engine's state)\n"
    )


def test_an_export_carries_no_code_unless_asked(tmp_path):
    from rlcore.checkpoint.export import remote_code_reference, strip_remote_code

    folder = tmp_path / "exported"
    (folder / "sub").mkdir(parents=True)
    (folder / "modeling_x.py").write_text("raise SystemExit")
    (folder / "sub" / "helper.py").write_text("")
    (folder / "config.json").write_text('{"auto_map": {"AutoConfig": "x.C"}, "model_type": "q"}')
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ x }}"}')
    assert remote_code_reference(folder) == ("config.json has an auto_map: ('AutoConfig', 'x.C')")
    assert strip_remote_code(folder) == ["modeling_x.py", "sub/helper.py", "config.json:auto_map"]
    assert sorted(p.name for p in folder.rglob("*.py")) == []
    assert remote_code_reference(folder) is None
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "q"}
    # Files without code are left as they were.
    assert (folder / "tokenizer_config.json").read_text() == '{"chat_template": "{{ x }}"}'
