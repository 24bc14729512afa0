"""``rollout/logprob_diff_mean`` / ``_max``: rollout log-probs vs the training engine's.

In one process (FSDP2 engine + HF rollout, float32): ~1e-6 with the weights in sync, large
once the engine takes an optimizer step the rollout was not synced to, small again after the
sync. Then real runs (Ray workers) log both metrics every step, from the driver's old-log-prob
pass and from the update's forward (on-policy), with ``rollout_is`` reading the same tensor.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.distributed as dist

from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.roles.mismatch import DIFF_MAX, DIFF_MEAN, logprob_diff_metrics

torch.set_num_threads(1)

IN_SYNC = 1e-4  # float32 kernels of generate (KV cache) vs one full forward
STALE = 1e-3  # one lr=1e-2 step moves log-probs by far more


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_mismatch_is_tiny_in_sync_large_when_the_sync_is_skipped(tmp_path):
    from transformers import AutoTokenizer

    from rlcore.roles.policy import push_weights
    from rlcore.testing.prompts import prompt_batch
    from rlcore.testing.tiny_model import build_tiny_model
    from rlcore_fsdp2.engine import FSDP2Engine
    from rlcore_hf.rollout import HFRollout

    path = str(build_tiny_model(tmp_path / "m", hidden=64, heads=2, kv_heads=1))
    tok = AutoTokenizer.from_pretrained(path)
    rollout = HFRollout(RolloutSpec(model_path=path))
    spec = EngineSpec(role="actor", model_path=path, optim=OptimConfig(lr=1e-2), micro_batch_size=4)
    actor = FSDP2Engine(spec, FSDP2Engine.Config())
    prompts = prompt_batch(tok, ["2+2=", "Say hi", "x", "What is 3 + 4?"]).repeat(
        2, interleave=True
    )
    temperature = 0.9
    sampling = SamplingParams(max_new_tokens=8, temperature=temperature, return_log_probs=True)

    def mismatch() -> dict[str, float]:
        gen = rollout.generate(prompts, sampling)
        old = actor.compute_log_prob(gen, temperature=temperature).log_probs
        assert old is not None
        return logprob_diff_metrics(old, gen.batch["rollout_log_probs"], gen.batch["response_mask"])

    in_sync = mismatch()
    assert set(in_sync) == {DIFF_MEAN, DIFF_MAX}
    assert 0 <= in_sync[DIFF_MEAN] <= in_sync[DIFF_MAX] < IN_SYNC, in_sync

    # One optimizer step on the engine, and no sync: the rollout samples a stale policy.
    gen = rollout.generate(prompts, sampling)
    batch = gen.union(DataProto.from_dict(tensors={"advantages": torch.randn(8, 8)}))

    def loss_fn(outputs, mb, totals):
        m = mb.batch["response_mask"].float()
        return -(outputs.log_probs * mb.batch["advantages"] * m).sum() / totals.tokens, {}

    actor.forward_backward(batch, loss_fn, temperature=temperature)
    actor.optimizer_step(lr=1e-2)
    stale = mismatch()
    assert stale[DIFF_MEAN] > STALE, stale
    assert stale[DIFF_MAX] > 10 * in_sync[DIFF_MAX], (stale, in_sync)

    push_weights(actor, rollout)  # what the policy worker does after every update
    synced = mismatch()
    assert synced[DIFF_MAX] < IN_SYNC, synced
    print(f"\nin sync {in_sync}\nsync skipped {stale}\nsynced again {synced}")


def test_no_valid_token_gives_no_metric():
    zeros = torch.zeros(2, 3)
    assert logprob_diff_metrics(zeros, zeros + 1, torch.zeros(2, 3, dtype=torch.long)) == {}


# --- real runs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("mismatch")
    model = tiny_run_model(root / "model")
    write_jsonl(arithmetic_rows([(a, b) for a in range(4) for b in range(4)]), root / "t.jsonl")
    return model, root / "t.jsonl"


def _run(assets, tmp_path, *, rollout_keys: str, actor_keys: str = "", algorithm: str = ""):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml
    from rlcore.trainer import run_training

    model, train = assets
    text = tiny_run_toml(
        model=model, train_files=[train], run_dir=tmp_path / "run", algorithm_options=algorithm
    )
    text = text.replace('name = "hf"\n', f'name = "hf"\n{rollout_keys}\n', 1)
    text = text.replace("[actor]\n", f"[actor]\n{actor_keys}\n", 1)
    assert run_training(load_config_text(text, source="mismatch.toml")) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_driver_pass_logs_the_mismatch_every_step(ray_session, assets, tmp_path):
    rows = _run(
        assets,
        tmp_path,
        rollout_keys="log_prob_metrics = true",
        actor_keys="reuse_on_policy_log_probs = false",  # the driver's old-log-prob pass
    )
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert "timing_s/old_log_prob" in row
        assert math.isfinite(row[DIFF_MEAN])
        assert 0 <= row[DIFF_MEAN] <= row[DIFF_MAX] < IN_SYNC
        print(f"step {row['step']}: mean {row[DIFF_MEAN]:.2e} max {row[DIFF_MAX]:.2e}")


@pytest.mark.slow
def test_on_policy_forward_logs_it_and_rollout_is_reads_the_same_log_probs(
    ray_session, assets, tmp_path
):
    # rollout_is asks for rollout_log_probs (HF's are not "cheap", so not asked otherwise).
    rows = _run(assets, tmp_path, rollout_keys="", algorithm='rollout_is = "token"')
    for row in rows:
        assert "timing_s/old_log_prob" not in row  # on-policy: the update's forward has them
        assert 0 <= row[DIFF_MEAN] <= row[DIFF_MAX] < IN_SYNC, row
        # pi_old / pi_rollout = 1 up to rounding: nothing truncated at the cap of 2.
        assert abs(row["actor/rollout_is_mean"] - 1.0) < 1e-3
        assert row["actor/rollout_is_truncated_frac"] == 0.0
        print(f"step {row['step']}: mean {row[DIFF_MEAN]:.2e} max {row[DIFF_MAX]:.2e}")


@pytest.mark.parametrize(
    ("rollout_keys", "algorithm", "asked"),
    [
        ("", "", False),  # HF: its log-probs cost B x R x vocab logits, off by default
        ("log_prob_metrics = true", "", True),
        ("log_prob_metrics = false", 'rollout_is = "sequence"', True),  # the loss needs them
    ],
)
def test_which_runs_ask_the_rollout_for_log_probs(assets, tmp_path, rollout_keys, algorithm, asked):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml
    from rlcore.trainer.builder import build_algorithm
    from rlcore.trainer.specs import build_specs

    model, train = assets
    text = tiny_run_toml(
        model=model, train_files=[train], run_dir=tmp_path / "run", algorithm_options=algorithm
    )
    text = text.replace('name = "hf"\n', f'name = "hf"\n{rollout_keys}\n', 1)
    config = load_config_text(text, source="mismatch.toml")
    specs = build_specs(config, build_algorithm(config), total_steps=2)
    assert specs.train_sampling.return_log_probs is asked
    assert specs.val_sampling.return_log_probs is False
