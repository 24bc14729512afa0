"""LoRA in the FSDP2 engine (one process, a private 1-rank gloo group): what trains, the
reference as adapters off, weight sync (merged and adapter-only), resume and both exports."""

from __future__ import annotations

import attrs
import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlcore.config.convert import structure
from rlcore.errors import ConfigError
from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.roles.policy import push_weights
from rlcore_fsdp2.engine import FSDP2Engine
from rlcore_fsdp2.lora import is_adapter_name

peft = pytest.importorskip("peft", reason="LoRA needs the extra: pip install 'rlcore-fsdp2[lora]'")

torch.set_num_threads(1)

LR = 2e-2  # large: a few steps move the adapters far enough to change every log-prob


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(
        build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=64, heads=2, kv_heads=1)
    )


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def make_batch(rows: int = 8, prompt: int = 6, response: int = 5, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones(rows, prompt + response, dtype=torch.long)
    for i in range(rows):
        attn[i, : i % prompt] = 0  # left padding
    ids = ids.masked_fill(attn == 0, 0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def token_mean_loss(outputs, mb, totals):
    mask = mb.batch["response_mask"].float()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def lora_engine(path: str, *, role: str = "actor", rank: int = 8, **spec_kw) -> FSDP2Engine:
    spec_kw.setdefault("optim", OptimConfig(lr=LR) if role != "ref" else None)
    spec = EngineSpec(role=role, model_path=path, micro_batch_size=4, **spec_kw)
    return FSDP2Engine(spec, FSDP2Engine.Config(lora_rank=rank, lora_alpha=16.0))


def train(engine: FSDP2Engine, steps: int, seed: int = 0) -> None:
    for s in range(steps):
        engine.forward_backward(make_batch(seed=seed + s), token_mean_loss, temperature=1.0)
        engine.optimizer_step(lr=LR)


def local(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def params(engine: FSDP2Engine) -> dict[str, torch.Tensor]:
    return {n: local(p) for n, p in engine.model.named_parameters()}


# --- what trains ------------------------------------------------------------------------------


def test_only_adapter_parameters_get_gradients_and_optimizer_state(tiny_path):
    e = lora_engine(tiny_path)
    before = params(e)
    e.forward_backward(make_batch(), token_mean_loss, temperature=1.0)
    with_grad = {n for n, p in e.model.named_parameters() if p.grad is not None}
    adapters = {n for n, _ in e.model.named_parameters() if is_adapter_name(n)}
    assert adapters
    assert with_grad == adapters
    # lora_B starts at zero, so on the first step only lora_B has a non-zero gradient
    assert all(
        local(e.model.get_parameter(n).grad).abs().sum() > 0 for n in adapters if "lora_B" in n
    )
    optimized = {id(p) for group in e.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for n, p in e.model.named_parameters() if n in adapters}
    e.optimizer_step(lr=LR)
    after = params(e)
    for name in before:
        changed = not torch.equal(before[name], after[name])
        assert changed == ("lora_B" in name), name
    assert all(len(e.optimizer.state[p]) for p in e.optimizer.state)
    assert len(e.optimizer.state) == len(adapters)


def test_config_keys_are_validated_with_their_path(tiny_path):
    _, problems = structure({"lora_rank": -1}, FSDP2Engine.Config, ("actor", "engine"))
    assert problems == [(("actor", "engine", "lora_rank"), "must be >= 0, got -1")]
    ok, problems = structure(
        {"lora_rank": 4, "target_modules": ["q_proj", "v_proj"]},
        FSDP2Engine.Config,
        ("actor", "engine"),
    )
    assert not problems
    assert ok.target_modules == ("q_proj", "v_proj")
    spec = EngineSpec(role="actor", model_path=tiny_path, optim=OptimConfig())
    with pytest.raises(ConfigError, match=r"\[actor.engine\].target_modules"):
        FSDP2Engine(spec, FSDP2Engine.Config(lora_rank=4, target_modules=("no_such_proj",)))
    critic = attrs.evolve(spec, role="critic", value_head=True)
    with pytest.raises(ConfigError, match="critic"):
        FSDP2Engine(critic, FSDP2Engine.Config(lora_rank=4))


# --- the reference: adapters off ----------------------------------------------------------------


def test_reference_with_adapters_off_equals_the_base_model_exactly(tiny_path):
    e = lora_engine(tiny_path)
    train(e, 3)
    batch = make_batch(seed=7)
    ref = lora_engine(tiny_path, role="ref")  # a role "ref" engine ignores LoRA: the base model
    assert ref.lora is None
    assert e.ref_in_actor
    assert not ref.ref_in_actor
    base = ref.compute_log_prob(batch, temperature=1.0).log_probs
    off = e.compute_ref_log_prob(batch, temperature=1.0).log_probs
    on = e.compute_log_prob(batch, temperature=1.0).log_probs
    assert torch.equal(off, base)
    assert (on - base).abs().max() > 1e-3  # the adapters did change the policy
    # and the adapters are back on after the reference pass
    assert torch.equal(e.compute_log_prob(batch, temperature=1.0).log_probs, on)


# --- weight sync ------------------------------------------------------------------------------


def _rollout(path: str, cls=None):
    from rlcore_hf.rollout import HFRollout

    cls = cls or HFRollout
    return cls(RolloutSpec(model_path=path, max_prompt_length=8, max_response_length=6, seed=3))


def _gap(engine: FSDP2Engine, rollout) -> float:
    """Largest |rollout log-prob - engine log-prob| over the generated tokens."""
    prompts = make_batch(rows=4, prompt=6, response=0, seed=11)
    prompts = DataProto.from_dict(
        tensors={k: prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    )
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, return_log_probs=True)
    out = rollout.generate(prompts, sampling)
    mine = engine.compute_log_prob(out, temperature=1.0).log_probs
    mask = out.batch["response_mask"].bool()
    return float((mine - out.batch["rollout_log_probs"])[mask].abs().max())


def test_merged_sync_gives_the_rollout_the_engines_log_probs(tiny_path):
    e = lora_engine(tiny_path)
    train(e, 3)
    synced, skipped = _rollout(tiny_path), _rollout(tiny_path)
    push_weights(e, synced)  # the HF rollout serves no adapters: merged weights
    names = [n for n, _ in e.named_parameters_for_sync()]
    assert not any("lora" in n or "base_layer" in n or n.startswith("base_model") for n in names)
    assert _gap(e, synced) < 1e-5
    # Without the sync the rollout samples from the base model: the same check fails.
    assert _gap(e, skipped) > 1e-3


class _AdapterRollout:
    """An HF rollout that serves peft adapters (as vLLM's LoRA requests do), for the test."""

    @staticmethod
    def make(path: str):
        from rlcore_hf.rollout import HFRollout

        class AdapterHFRollout(HFRollout):
            supports_lora_adapters = True
            updates = 0

            def update_weights(self, named_tensors):
                msg = "adapter-capable rollout got full weights"
                raise AssertionError(msg)

            def update_adapter(self, adapter_config, named_tensors):
                from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

                if not hasattr(self.model, "peft_config"):
                    keys = {f.name for f in attrs_fields(LoraConfig)}
                    config = LoraConfig(**{k: v for k, v in adapter_config.items() if k in keys})
                    self.model = get_peft_model(self.model, config)
                state = {n: t.clone() for n, t in named_tensors}
                result = set_peft_model_state_dict(self.model, state)
                assert not result.unexpected_keys, result.unexpected_keys
                self.updates += 1

        return _rollout(path, AdapterHFRollout)


def attrs_fields(cls):
    import dataclasses

    return [f for f in dataclasses.fields(cls) if f.init]


def test_adapter_only_sync_where_the_rollout_serves_adapters(tiny_path):
    e = lora_engine(tiny_path)
    train(e, 3)
    rollout = _AdapterRollout.make(tiny_path)
    base_weight = local(dict(rollout.model.named_parameters())["model.embed_tokens.weight"])
    push_weights(e, rollout)  # update_weights would raise: only the adapter travels
    assert rollout.updates == 1
    assert _gap(e, rollout) < 1e-5
    train(e, 1, seed=20)
    assert _gap(e, rollout) > 1e-4  # stale adapter
    push_weights(e, rollout)
    assert rollout.updates == 2
    assert _gap(e, rollout) < 1e-5
    embed = dict(rollout.model.named_parameters())["base_model.model.model.embed_tokens.weight"]
    assert torch.equal(local(embed), base_weight)


# --- checkpoints and export ---------------------------------------------------------------------


def test_resume_is_bit_identical_and_the_checkpoint_holds_adapters_only(tiny_path, tmp_path):
    a = lora_engine(tiny_path)
    train(a, 2)
    a.save_checkpoint(str(tmp_path / "ckpt"))
    train(a, 2, seed=10)
    b = lora_engine(tiny_path)
    b.load_checkpoint(str(tmp_path / "ckpt"))
    assert b.global_step == 2
    train(b, 2, seed=10)
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    batch = make_batch(seed=5)
    assert torch.equal(
        a.compute_log_prob(batch, temperature=1.0).log_probs,
        b.compute_log_prob(batch, temperature=1.0).log_probs,
    )
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys
    assert all(is_adapter_name(k) for k in model_keys)


def test_both_export_forms_load_and_match(tiny_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    e = lora_engine(tiny_path)
    train(e, 3)
    e.export_hf(str(tmp_path / "merged"))
    e.export_adapter(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "merged" / "tokenizer_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    batch = make_batch(seed=9)
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    pos = batch.batch["position_ids"]
    with torch.no_grad():
        lm = merged(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        la = adapted(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        with adapted.disable_adapter():
            lb = adapted(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    keep = mask.bool()
    assert (lm - la)[keep].abs().max() < 1e-4
    assert (lm - lb)[keep].abs().max() > 1e-3  # the merge did carry the adapters
    # and both equal the engine's own log-probs
    from rlcore_fsdp2.logprob import log_probs_from_logits

    r = batch.batch["responses"].shape[1]
    mine = e.compute_log_prob(batch, temperature=1.0).log_probs
    theirs = log_probs_from_logits(lm[:, -r - 1 : -1], batch.batch["responses"])
    assert (mine - theirs).abs().max() < 1e-5
