"""Every config error is one line naming the key path; each test asserts the exact text."""

from __future__ import annotations

import attrs
import pytest
import rlcore_fake.good
import rlcore_fake_dup

from rlcore.config import ConfigValidationError, load_config, load_config_text
from rlcore.errors import ConfigError
from rlcore.hookspecs import hookimpl
from rlcore.interfaces import BaseReward, key
from rlcore.plugins import PluginRegistry

BASE = """
[data]
train_files = "train.jsonl"
train_batch_size = 4

[model]
path = "/models/tiny"

[actor.engine]
name = "fake"

[rollout]
name = "fake"

[reward]
default = "fake"

[algorithm]
name = "fake"
"""


@pytest.fixture(scope="module")
def registry():
    # In-process registration: the messages do not depend on which real plugins are installed.
    reg = PluginRegistry(entry_points=False)
    reg.register(rlcore_fake.good)
    reg.register(rlcore_fake_dup)
    return reg


def errors(registry, *overrides, text=BASE):
    with pytest.raises(ConfigValidationError) as exc:
        load_config_text(text, source="run.toml", overrides=overrides, registry=registry)
    return list(exc.value.errors)


CASES = [
    # --- values out of range (the validator's own condition is kept) ---
    (["actor.optim.lr=-1.0"], ["actor.optim.lr: must be > 0.0, got -1.0"]),
    (["rollout.top_p=1.5"], ["rollout.top_p: must be <= 1.0, got 1.5"]),
    (["actor.ppo_epochs=0"], ["actor.ppo_epochs: must be >= 1, got 0"]),
    (
        ["resources.device=gpu"],
        ['resources.device: must be one of "cpu", "cuda"; got "gpu"'],
    ),
    (
        ["actor.optim.schedule=linear"],
        ['actor.optim.schedule: must be one of "constant", "cosine"; got "linear"'],
    ),
    (["model.path=''"], ["model.path: must not be empty"]),
    # --- wrong types: no silent int(1.5) == 1 or float("1e-5") ---
    (["actor.ppo_epochs=1.5"], ["actor.ppo_epochs: expected an integer, got 1.5"]),
    (['actor.optim.lr="1e-5"'], ['actor.optim.lr: expected a number, got "1e-5"']),
    (["data.train_batch_size=true"], ["data.train_batch_size: expected an integer, got true"]),
    (
        ["actor.gradient_checkpointing=1"],
        ["actor.gradient_checkpointing: expected true or false, got 1"],
    ),
    (["actor.optim.betas=[0.9]"], ["actor.optim.betas: expected an array of 2 values, got [0.9]"]),
    (['trainer.loggers=["console", 3]'], ["trainer.loggers[1]: expected a string, got 3"]),
    (["model=3"], ["model: expected a table, got 3"]),
    # --- unknown keys, with "did you mean" ---
    (
        ["actor.optim.learning_rate=1e-5"],
        ["actor.optim.learning_rate: unknown key (did you mean 'lr'?)"],
    ),
    (["rollout.temprature=0.5"], ["rollout.temprature: unknown key (did you mean 'temperature'?)"]),
    (["actr.ppo_epochs=2"], ["actr: unknown section (did you mean 'actor'?)"]),
    (["trainer.zzz=1"], ["trainer.zzz: unknown key"]),
    # --- plugin sections, validated by the plugin's own Config ---
    (["actor.engine.shard=2"], ["actor.engine.shard: unknown key (did you mean 'shards'?)"]),
    (["actor.engine.shards=0"], ["actor.engine.shards: must be >= 1, got 0"]),
    (["critic.engine.shards=0"], ["critic.engine.shards: must be >= 1, got 0"]),
    (
        ["rollout.gpu_memory_utilization=2.0"],
        ["rollout.gpu_memory_utilization: must be <= 1.0, got 2.0"],
    ),
    (
        ["reward.options.fake.format_scor=1"],
        ["reward.options.fake.format_scor: unknown key (did you mean 'format_score'?)"],
    ),
    (
        ["actor.engine.name=fkae"],
        ["actor.engine.name: unknown engine 'fkae'. Installed: fake. Did you mean 'fake'?"],
    ),
    (
        ["actor.engine.name=fsdp2"],
        [
            "actor.engine.name: engine 'fsdp2' is not installed. "
            "Install it with: pip install rlcore-fsdp2"
        ],
    ),
    (
        ['reward.sources."openai/gsm8k"="gsm8k"'],
        [
            "reward.sources.\"openai/gsm8k\": reward 'gsm8k' is not installed. "
            "Install it with: pip install rlcore-gsm8k"
        ],
    ),
    (
        ["reward.default=fake_dup"],
        [
            "reward.default: reward 'fake_dup' is provided by both plugin 'rlcore_fake.good' "
            "and plugin 'rlcore_fake_dup'"
        ],
    ),
    (
        ["rollout.name=fake_notsub"],
        [
            "rollout.name: rollout 'fake_notsub' (rlcore_fake.components:NotARollout) from "
            "plugin 'rlcore_fake.good' is not a subclass of rlcore.interfaces.BaseRollout"
        ],
    ),
    # --- rules across keys ---
    (
        ["actor.micro_batch_size=1", "actor.max_tokens_per_micro_batch=4096"],
        [
            "actor.max_tokens_per_micro_batch: set micro_batch_size or "
            "max_tokens_per_micro_batch, not both"
        ],
    ),
    (
        ["trainer.total_steps=10", "trainer.total_epochs=2"],
        ["trainer.total_steps: set total_steps or total_epochs, not both"],
    ),
    (
        ["reward.default=[]"],
        [
            'reward.default: no reward selected; set reward.default = "NAME", map '
            "[reward.sources] or enable [reward_model]"
        ],
    ),
    (
        ["reward.weights.math=2.0"],
        ["reward.weights.math: reward 'math' is not selected by reward.default or reward.sources"],
    ),
    (
        ['trainer.loggers=["console", "nosuch"]'],
        [
            "trainer.loggers[1]: unknown logger 'nosuch'. "
            "Installed: console, jsonl, tensorboard."  # the test registry: built-ins only
        ],
    ),
    # --- overrides themselves ---
    (
        ["actor.optim.lr"],
        ["override 'actor.optim.lr': expected KEY=VALUE, e.g. actor.optim.lr=1e-5"],
    ),
    (["actor..lr=1"], ["override 'actor..lr=1': 'actor..lr' is not a valid key path"]),
    (["model.path.x=1"], ["override 'model.path.x=1': model.path is not a table"]),
]


# Sizes that do not divide evenly still run (the driver pads mini-batches with zero-weight
# rows), so validation accepts them: it rejects only what cannot run.
UNEVEN = [
    ["actor.ppo_mini_batch_size=3"],
    ["rollout.n=3", "actor.micro_batch_size=2", "actor.ppo_mini_batch_size=1"],
    ["resources.processes_per_node=3", "actor.max_tokens_per_micro_batch=1024"],
    ["critic.ppo_mini_batch_size=8"],
    [
        "data.train_batch_size=5",
        "rollout.n=8",
        "resources.processes_per_node=2",
        "actor.micro_batch_size=4",
    ],
]


@pytest.mark.parametrize("overrides", UNEVEN, ids=[c[0] for c in UNEVEN])
def test_uneven_batch_sizes_are_accepted(registry, overrides):
    cfg = load_config_text(BASE, source="run.toml", overrides=overrides, registry=registry)
    assert cfg.data.train_batch_size >= 1


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[c[0][0] for c in CASES])
def test_one_line_per_error(registry, overrides, expected):
    assert errors(registry, *overrides) == expected


def test_every_error_is_reported_at_once(registry):
    text = BASE + '\n[resources]\ndevice = "tpu"\nnodes = 2\n'
    found = errors(
        registry,
        "actor.optim.lr=0",
        "actor.optim.weight_decay=-0.1",
        "actor.engine.shards=0",
        "algorithm.clip_ratio=0",
        "algorithm.loss_agg_mode=sum",
        "trainer.sead=1",
        text=text,
    )
    assert found == [
        "actor.optim.lr: must be > 0.0, got 0.0",
        "actor.optim.weight_decay: must be >= 0.0, got -0.1",
        "trainer.sead: unknown key (did you mean 'seed'?)",
        'resources.device: must be one of "cpu", "cuda"; got "tpu"',
        "resources.nodes: unknown key (did you mean 'nnodes'?)",
        "actor.engine.shards: must be >= 1, got 0",
        "algorithm.clip_ratio: must be > 0.0, got 0.0",
        'algorithm.loss_agg_mode: must be one of "token-mean", "seq-mean-token-mean"; got "sum"',
    ]


def test_rendered_message_single_and_multi(registry):
    with pytest.raises(ConfigError) as exc:
        load_config_text(BASE, source="run.toml", overrides=["rollout.n=0"], registry=registry)
    assert str(exc.value) == "run.toml: rollout.n: must be >= 1, got 0"
    with pytest.raises(ConfigError) as exc:
        load_config_text(
            BASE,
            source="run.toml",
            overrides=["rollout.n=0", "rollout.top_k=-2"],
            registry=registry,
        )
    assert str(exc.value) == (
        "run.toml: 2 errors\n"
        "  rollout.n: must be >= 1, got 0\n"
        "  rollout.top_k: must be >= -1, got -2"
    )


def test_missing_required_keys(registry):
    assert errors(registry, text='[reward]\ndefault = "fake"\n') == [
        "data.train_files: missing required key",
        "model.path: missing required key",
        "actor.engine.name: engine 'fsdp2' is not installed. "
        "Install it with: pip install rlcore-fsdp2",
        "rollout.name: rollout 'hf' is not installed. Install it with: pip install rlcore-hf",
        "algorithm.name: algorithm 'grpo' is not installed. "
        "Install it with: pip install rlcore-grpo",
    ]


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as exc:
        load_config(missing)
    assert str(exc.value) == f"config file '{missing}' not found"


def test_toml_syntax_error_names_file_line_and_column(tmp_path, registry):
    path = tmp_path / "run.toml"
    path.write_text('[data]\ntrain_files = "a.jsonl"\ntrain_batch_size = = 4\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path, registry=registry)
    assert str(exc.value) == f"invalid TOML in {path} at line 3, column 20: Invalid value"


# --- issue 49 item 5: a plugin's required keys and its validator's ConfigError ---------------


def _mode(_instance, _attribute, value):
    if value not in ("fast", "exact"):
        msg = f"unknown mode {value!r}; use fast or exact"
        raise ConfigError(msg)


class StrictReward(BaseReward):
    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        endpoint: str = key(help="Where the scorer listens (required).")
        mode: str = key("fast", "Scoring mode: fast or exact.", validator=_mode)

    def score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 0.0


STRICT = StrictReward


class _StrictPlugin:
    contract_version = 2

    @staticmethod
    @hookimpl
    def register_rewards():
        return {"strict": STRICT}


def _strict_registry():
    reg = PluginRegistry(entry_points=False)
    reg.register(rlcore_fake.good)
    reg.register(_StrictPlugin(), name="strict")
    return reg


def test_a_plugin_validators_config_error_carries_file_and_key_path():
    text = BASE.replace('default = "fake"', 'default = "strict"')
    text += '\n[reward.options.strict]\nendpoint = "http://127.0.0.1:9"\nmode = "warp"\n'
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, source="run.toml", registry=_strict_registry())
    assert str(exc.value) == (
        "run.toml: reward.options.strict.mode: unknown mode 'warp'; use fast or exact"
    )
    # The required key, when left out, is named like any core key.
    text = BASE.replace('default = "fake"', 'default = "strict"')
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, source="run.toml", registry=_strict_registry())
    assert str(exc.value) == "run.toml: reward.options.strict.endpoint: missing required key"


def test_conformance_allows_a_required_key_given_a_config():
    from rlcore.testing.conformance import check_config, check_reward

    config = STRICT.Config(endpoint="http://127.0.0.1:9")
    assert check_config(STRICT, config, "reward.options.strict") is config
    check_reward(STRICT, config=config, cases=[("anything", "1", 0.0)])
    with pytest.raises(AssertionError) as exc:
        check_config(STRICT, None, "reward.options.strict")
    assert str(exc.value).endswith(
        "a Config with required keys needs config= (an instance with them set): required keys "
        "endpoint"
    )
