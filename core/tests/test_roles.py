"""The role workers in this process (one rank, no Ray): generation layout, weight sync after
an update, mini-batch/epoch counts, the critic's loss, and the driver's metric reduction."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("roles")
    model = build_tiny_model(root / "model", hidden=64, layers=1, heads=2, kv_heads=1)
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "reward_model": {"ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 6), (7, 8)])
    ]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, data


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    """The workers join a 1-rank gloo group; leave the test process as found."""
    import torch.distributed as dist

    was = dist.is_initialized()
    mp = pytest.MonkeyPatch()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        mp.setenv(key, value)
    from rlcore.workers.worker import find_free_port

    mp.setenv("MASTER_PORT", str(find_free_port()))
    yield
    if dist.is_initialized() and not was:
        dist.destroy_process_group()
    mp.undo()


def _config(assets, *, algorithm: str = "grpo", extra: str = ""):
    from rlcore.config import load_config_text

    model, data = assets
    return load_config_text(
        f"""
[data]
train_files = ["{data}"]
max_prompt_length = 64
max_response_length = 6
train_batch_size = 4

[model]
path = "{model}"

[actor]
ppo_mini_batch_size = 2
ppo_epochs = 2
micro_batch_size = 2
optim = {{ lr = 1e-2 }}

[critic]
optim = {{ lr = 1e-2 }}

[rollout]
n = 2

[reward]
default = ["gsm8k"]

[algorithm]
name = "{algorithm}"
{extra}
""",
        source="roles.toml",
    )


def _specs(config, total_steps: int):
    from rlcore.trainer.builder import build_algorithm
    from rlcore.trainer.specs import build_specs

    return build_specs(config, build_algorithm(config), total_steps)


def _prompts(config):
    from rlcore.data import PromptDataLoader, PromptDataset, load_tokenizer

    tok = load_tokenizer(config.model.path)
    ds = PromptDataset(config.data.train_files, tok, max_prompt_length=64)
    batch = next(iter(PromptDataLoader(ds, 4, shuffle=False)))
    return batch.select(
        batch_keys=["input_ids", "attention_mask", "position_ids"], non_tensor_batch_keys=[]
    )


@pytest.fixture(scope="module")
def policy(assets):
    from rlcore.roles.policy import ActorRolloutRefWorker

    config = _config(assets, extra="use_kl_loss = true")
    specs = _specs(config, total_steps=3)
    assert specs.policy.ref is not None  # the algorithm needs KL
    worker = ActorRolloutRefWorker(specs.policy)
    worker.init_model()
    worker.config, worker.specs = config, specs  # for the tests below
    return worker


def _rollout_params(worker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.rollout.model.state_dict().items()}


def test_generate_layout_and_validation_sampling(policy):
    prompts = _prompts(policy.config)
    rows = prompts.repeat(policy.specs.n, interleave=True)  # the driver expands, once
    gen = policy.generate_sequences(rows, policy.specs.train_sampling)
    assert len(gen) == 4 * 2  # one response per row
    assert gen.batch["responses"].shape == (8, 6)
    assert torch.equal(gen.batch["prompts"][0], gen.batch["prompts"][1])  # interleaved
    assert "timing_s/worker/generate" in gen.meta_info["metrics"]
    # [rollout.val] defaults: greedy, one sample per prompt.
    assert policy.specs.val_n == 1
    val = policy.generate_sequences(prompts, policy.specs.val_sampling)
    assert len(val) == 4
    again = policy.generate_sequences(prompts, policy.specs.val_sampling)
    assert torch.equal(val.batch["responses"], again.batch["responses"])


def test_update_moves_the_actor_and_syncs_the_rollout(policy):
    from rlcore.protocol import DataProto

    rows = _prompts(policy.config).repeat(2, interleave=True)
    gen = policy.generate_sequences(rows, policy.specs.train_sampling)
    gen.meta_info.pop("metrics")
    batch = gen.select(
        batch_keys=["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
    )
    old = policy.compute_log_prob(batch)
    ref = policy.compute_ref_log_prob(batch)
    assert old.batch["old_log_probs"].shape == (8, 6)
    # Nothing trained yet: the reference and the actor agree.
    torch.testing.assert_close(old.batch["old_log_probs"], ref.batch["ref_log_prob"])
    before = _rollout_params(policy)

    g = torch.Generator().manual_seed(0)
    update = DataProto.from_dict(
        tensors={
            **batch.batch,
            "old_log_probs": old.batch["old_log_probs"],
            "ref_log_prob": ref.batch["ref_log_prob"],
            "advantages": torch.randn(8, 6, generator=g),
        },
    )
    out = policy.update_actor(update, 0)
    metrics = out.meta_info["metrics"]
    # 4 prompts / mini-batches of 2 prompts x 2 epochs = 4 optimizer steps.
    assert len(metrics["actor/grad_norm"]) == 4
    assert all(v > 0 for v in metrics["actor/grad_norm"])
    assert {"actor/pg_loss", "actor/kl_loss", "actor/lr"} <= set(metrics)
    # The LR comes from the core's schedule at each optimizer step taken.
    from rlcore.engine import learning_rate

    update_spec = policy.specs.policy.update
    assert metrics["actor/lr"] == [
        learning_rate(update_spec.optim, i, update_spec.schedule_steps) for i in range(4)
    ]
    assert "timing_s/worker/weight_sync" in metrics

    after = _rollout_params(policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    synced = dict(policy.actor.named_parameters_for_sync())
    for name, tensor in after.items():
        if name in synced:
            torch.testing.assert_close(tensor, synced[name].to(tensor.dtype), rtol=0, atol=0)
    # The rollout's model now is the actor's: same log-probs as the engine computes.
    new = policy.compute_log_prob(batch).batch["old_log_probs"]
    assert not torch.allclose(new, old.batch["old_log_probs"])


def test_critic_loss_falls_on_a_fixed_batch(assets):
    from rlcore.protocol import DataProto
    from rlcore.roles.critic import CriticWorker

    config = _config(assets, algorithm="ppo")
    specs = _specs(config, total_steps=10)
    assert specs.critic is not None
    critic = CriticWorker(specs.critic)
    critic.init_model()
    g = torch.Generator().manual_seed(1)
    rows, prompt, response = 8, 5, 6
    ids = torch.randint(3, 200, (rows, prompt + response), generator=g)
    mask = torch.ones(rows, prompt + response, dtype=torch.long)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1),
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
        }
    )
    returns = torch.full((rows, response), 1.0)
    losses = []
    for step in range(4):
        values = critic.compute_values(batch).batch["values"]
        assert values.shape == (rows, response)
        data = DataProto.from_dict(
            tensors={**batch.batch, "values": values, "returns": returns},
        )
        metrics = critic.update_critic(data, step).meta_info["metrics"]
        losses.append(sum(metrics["critic/vf_loss"]) / len(metrics["critic/vf_loss"]))
    assert losses[-1] < losses[0]


def test_reduce_worker_metrics_takes_the_slowest_rank_for_times():
    from rlcore.tracking.reductions import reduce_metrics as reduce_worker_metrics

    out = reduce_worker_metrics(
        {"timing_s/worker/generate": [1.0, 3.0], "actor/pg_loss": [1.0, 3.0], "x": 2, "e": []}
    )
    assert out == {"timing_s/worker/generate": 3.0, "actor/pg_loss": 2.0, "x": 2.0}


def test_an_engine_without_export_is_a_reason_not_a_traceback(policy, tmp_path, monkeypatch):
    def no_export(path):
        raise NotImplementedError("this engine keeps sharded state only")

    monkeypatch.setattr(policy.actor, "export_hf", no_export)
    assert policy.export_hf(str(tmp_path / "hf")) == "this engine keeps sharded state only"
    monkeypatch.undo()
    assert policy.export_hf(str(tmp_path / "hf")) is None
    assert (tmp_path / "hf" / "config.json").is_file()


def test_colocated_memory_order(policy, monkeypatch):
    """Item 6 of the GPU readiness issue, in the order of calls (offload/onload are no-ops on
    CPU, so the numbers are unchanged): the rollout is built with actor and reference offloaded;
    a sync wakes the rollout's weights only, loads the actor, hands its weights over (shared or
    copied), offloads the actor, and only then wakes the rest (KV cache); the reference is on
    the device for its pass only."""
    from rlcore.roles.policy import ActorRolloutRefWorker

    calls: list[tuple[str, str]] = []

    def spy(cls, name, who):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            calls.append((who(self), name))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)

    for name in ("offload", "onload"):
        spy(type(policy.actor), name, lambda self: self.spec.role)
    for name in ("__init__", "wake_up", "wake_up_weights", "update_weights", "share_weights"):
        spy(type(policy.rollout), name, lambda self: "rollout")
    worker = ActorRolloutRefWorker(policy.specs.policy)
    worker.init_model()

    def at(call, last=False):
        found = [i for i, c in enumerate(calls) if c == call]
        assert found, f"{call} not called: {calls}"
        return found[-1] if last else found[0]

    def synced():  # the weights handed over: shared (one rank, same dtype) or streamed
        handed = {("rollout", "share_weights"), ("rollout", "update_weights")}
        found = [i for i, c in enumerate(calls) if c in handed]
        assert found, f"no weight sync: {calls}"
        return found[0]

    built = at(("rollout", "__init__"))
    assert at(("actor", "offload")) < built
    assert at(("ref", "offload")) < built
    assert (
        built
        < at(("rollout", "wake_up_weights"))
        < at(("actor", "onload"))
        < synced()
        < at(("actor", "offload"), last=True)
        < at(("rollout", "wake_up"), last=True)
    )
    calls.clear()
    rows = _prompts(policy.config)
    gen = worker.generate_sequences(rows, policy.specs.val_sampling)
    worker.compute_ref_log_prob(
        gen.select(
            batch_keys=["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
        )
    )
    assert at(("ref", "onload")) < at(("ref", "offload"), last=True)
