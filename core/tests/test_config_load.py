"""Loading: defaults resolved, plugin options kept, overrides parsed as TOML, show round-trips."""

from __future__ import annotations

import tomllib

import pytest
import rlcore_fake.good
from rlcore_fake.components import FakeAlgorithm, FakeEngine, FakeReward, FakeRollout

from rlcore.config import (
    ConfigValidationError,
    RunConfig,
    apply_overrides,
    config_to_dict,
    dump_toml,
    load_config,
    load_config_text,
    validate,
)
from rlcore.config.loader import DEFAULT_MAX_TOKENS_PER_MICRO_BATCH
from rlcore.interfaces import OptimConfig, SamplingParams
from rlcore.plugins import PluginRegistry

QUICKSTART = """
[data]
train_files = ["train.jsonl"]
val_files = "test.jsonl"
train_batch_size = 8

[model]
path = "/models/tiny"

[actor]
ppo_mini_batch_size = 4
optim = { lr = 1e-5 }

[actor.engine]
name = "fake"
shards = 2

[rollout]
name = "fake"
n = 2
temperature = 0.7
gpu_memory_utilization = 0.3

[reward]
default = "fake"
sources = { "openai/gsm8k" = "fake_exact", "lighteval/MATH" = ["fake", "fake_exact"] }
weights = { fake_exact = 0.5 }

[reward.options.fake_exact]
strip = false

[algorithm]
name = "fake"
kl_coef = 0.01
"""


@pytest.fixture(scope="module")
def registry():
    reg = PluginRegistry(entry_points=False)
    reg.register(rlcore_fake.good)
    return reg


@pytest.fixture(scope="module")
def cfg(registry) -> RunConfig:
    return load_config_text(QUICKSTART, registry=registry)


def test_defaults_are_resolved(cfg):
    assert cfg.data.train_files == ("train.jsonl",)
    assert cfg.data.val_files == ("test.jsonl",)
    assert cfg.model.tokenizer_path == "/models/tiny"
    assert cfg.actor.ppo_mini_batch_size == 4
    assert cfg.actor.micro_batch_size is None  # dynamic micro-batches by default
    assert cfg.actor.max_tokens_per_micro_batch == DEFAULT_MAX_TOKENS_PER_MICRO_BATCH
    assert cfg.actor.optim == OptimConfig(lr=1e-5)
    assert cfg.critic.model_path == "/models/tiny"
    assert cfg.critic.ppo_mini_batch_size == 4
    assert cfg.critic.ppo_epochs == 1
    assert cfg.critic.optim.lr == 1e-5
    assert cfg.trainer.total_epochs == 1
    assert cfg.trainer.total_steps is None
    assert cfg.trainer.run_dir == "runs/rlcore"
    assert cfg.resources.world_size == 1


def test_plugin_options_are_the_plugins_own_config(cfg):
    assert cfg.actor.engine.name == "fake"
    assert cfg.actor.engine.options == FakeEngine.Config(shards=2)
    # ref and critic use the actor's engine, options included, unless they have their own.
    assert cfg.ref.engine == cfg.actor.engine
    assert cfg.critic.engine == cfg.actor.engine
    assert cfg.rollout.options == FakeRollout.Config(gpu_memory_utilization=0.3)
    assert cfg.algorithm.options == FakeAlgorithm.Config(kl_coef=0.01)
    assert cfg.reward.options["fake"] == FakeReward.Config()
    assert type(cfg.reward.options["fake_exact"]).__qualname__ == "FakeExactReward.Config"
    assert cfg.reward.options["fake_exact"].strip is False


def test_reward_routing(cfg):
    assert cfg.reward.default == ("fake",)
    assert cfg.reward.sources["openai/gsm8k"] == ("fake_exact",)
    assert cfg.reward.sources["lighteval/MATH"] == ("fake", "fake_exact")
    assert cfg.reward.selected() == ("fake", "fake_exact")
    assert cfg.reward.weights == {"fake": 1.0, "fake_exact": 0.5}


def test_sampling_params(cfg):
    # n is not sampling: the driver repeats the prompts n times.
    assert cfg.rollout.n == 2
    assert cfg.rollout.sampling(64) == SamplingParams(temperature=0.7, max_new_tokens=64)
    greedy = cfg.rollout.val.sampling(64)
    assert (cfg.rollout.val.n, greedy.do_sample, greedy.temperature) == (1, False, 0.0)


def test_own_ref_and_critic_engine(registry):
    text = (
        QUICKSTART
        + "\n[ref.engine]\nreshard_after_forward = false\n[critic]\nmicro_batch_size = 2\n"
    )
    cfg = load_config_text(text, registry=registry)
    assert cfg.ref.engine.name == "fake"  # the actor's plugin, its own options
    assert cfg.ref.engine.options == FakeEngine.Config(reshard_after_forward=False)
    assert cfg.critic.micro_batch_size == 2
    assert cfg.ref.max_tokens_per_micro_batch == DEFAULT_MAX_TOKENS_PER_MICRO_BATCH


def test_token_budget_micro_batching_is_inherited(registry):
    cfg = load_config_text(
        QUICKSTART, overrides=["actor.max_tokens_per_micro_batch=2048"], registry=registry
    )
    assert cfg.actor.micro_batch_size is None
    assert cfg.ref.max_tokens_per_micro_batch == 2048
    assert cfg.critic.max_tokens_per_micro_batch == 2048


def test_overrides_are_parsed_as_toml(registry):
    cfg = load_config_text(
        QUICKSTART,
        overrides=[
            "actor.optim.lr=3e-6",
            "actor.optim.betas=[0.9, 0.95]",
            "trainer.val_before_train=false",
            "trainer.experiment_name=exp1",  # a bare word is a string
            'trainer.resume="off"',
            'reward.sources."openai/gsm8k"=fake',
            "trainer.total_steps=5",
        ],
        registry=registry,
    )
    assert cfg.actor.optim.lr == 3e-6
    assert cfg.actor.optim.betas == (0.9, 0.95)
    assert cfg.trainer.val_before_train is False
    assert cfg.trainer.experiment_name == "exp1"
    assert cfg.trainer.run_dir == "runs/exp1"
    assert cfg.trainer.resume == "off"
    assert cfg.reward.sources["openai/gsm8k"] == ("fake",)
    assert (cfg.trainer.total_steps, cfg.trainer.total_epochs) == (5, None)


def test_apply_overrides_creates_tables():
    raw: dict = {"a": {"x": 1}}
    assert apply_overrides(raw, ["a.y.z=2", "b=[1, 2]", "a.x=a b"]) == []
    assert raw == {"a": {"x": "a b", "y": {"z": 2}}, "b": [1, 2]}


def test_an_inline_table_override_merges_into_the_table(registry):
    """``actor.optim={warmup_steps=1}`` keeps the file's ``lr`` (issue 15: it used to replace
    the whole table, silently resetting ``lr`` to its default)."""
    cfg = load_config_text(
        QUICKSTART,
        overrides=["actor.optim={warmup_steps=1, betas=[0.9, 0.95]}", "actor={ppo_epochs=2}"],
        registry=registry,
    )
    assert cfg.actor.optim.lr == 1e-5  # from the file
    assert (cfg.actor.optim.warmup_steps, cfg.actor.optim.betas) == (1, (0.9, 0.95))
    assert (cfg.actor.ppo_mini_batch_size, cfg.actor.ppo_epochs) == (4, 2)
    assert cfg.actor.engine.name == "fake"  # [actor.engine] kept by the [actor] merge


def test_apply_overrides_merges_nested_tables_and_replaces_other_values():
    raw: dict = {"a": {"x": 1, "t": {"p": 1, "q": 2}, "arr": [1, 2]}}
    assert apply_overrides(raw, ["a={t={q=3}, arr=[3]}", "a.x={k=1}"]) == []
    # Tables merge key by key at every level; arrays and scalars are replaced.
    assert raw == {"a": {"x": {"k": 1}, "t": {"p": 1, "q": 3}, "arr": [3]}}


def test_show_round_trips(cfg, registry):
    text = dump_toml(config_to_dict(cfg))
    data = tomllib.loads(text)
    assert data["actor"]["engine"] == {"name": "fake", "reshard_after_forward": True, "shards": 2}
    assert data["rollout"]["gpu_memory_utilization"] == 0.3
    assert data["reward"]["sources"]["openai/gsm8k"] == ["fake_exact"]
    assert "total_steps" not in data["trainer"]  # None has no TOML form
    assert load_config_text(text, registry=registry) == cfg


def test_load_and_validate_file(tmp_path, registry):
    path = tmp_path / "run.toml"
    path.write_text(QUICKSTART)
    assert load_config(path, registry=registry).rollout.n == 2
    assert validate(path, registry=registry) == ()
    assert validate(path, ["rollout.n=0"], registry=registry) == ("rollout.n: must be >= 1, got 0",)
    assert validate(tmp_path / "x.toml", registry=registry) == (
        f"config file '{tmp_path / 'x.toml'}' not found",
    )


def test_errors_are_a_config_error_with_lines(registry):
    with pytest.raises(ConfigValidationError) as exc:
        load_config_text(QUICKSTART, source="q.toml", overrides=["rollout.n=0"], registry=registry)
    assert exc.value.source == "q.toml"
    assert exc.value.errors == ("rollout.n: must be >= 1, got 0",)
