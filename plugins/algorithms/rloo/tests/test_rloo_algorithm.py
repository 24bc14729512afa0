"""rlcore-rloo: discovery, Config, [algorithm] errors, and leave-one-out advantages through
DataProto with shuffled groups, against a plain-loop float64 reference."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import rlcore_rloo.plugin
from rlcore.config.convert import structure
from rlcore.config.loader import ConfigValidationError, load_config_text
from rlcore.interfaces import BaseAlgorithm
from rlcore.plugins import PluginRegistry
from rlcore.protocol import DataProto


@pytest.fixture(scope="module")
def rloo_cls():
    registry = PluginRegistry()
    (entry,) = [e for e in registry.entries("algorithm") if e.name == "rloo"]
    assert entry.distribution == "rlcore-rloo"
    assert entry.target == "rlcore_rloo.algorithm:RLOO"
    return registry.resolve("algorithm", "rloo")


def test_discovered_through_entry_point(rloo_cls):
    assert issubclass(rloo_cls, BaseAlgorithm)
    assert rloo_cls.__name__ == "RLOO"


def test_plugin_module_imports_nothing_heavy():
    code = "import sys, rlcore_rloo.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_defaults_validate(rloo_cls):
    cfg, problems = structure({}, rloo_cls.Config, ("algorithm",))
    assert problems == []
    algo = rloo_cls(cfg)
    assert not algo.needs_critic
    assert not algo.needs_reference
    cfg, _ = structure({"use_kl_in_reward": True}, rloo_cls.Config, ("algorithm",))
    assert rloo_cls(cfg).needs_reference


def test_unknown_option_is_one_line_with_key_path():
    only_this = PluginRegistry(entry_points=False)
    only_this.register(rlcore_rloo.plugin, name="rloo")
    with pytest.raises(ConfigValidationError) as info:
        load_config_text(
            '[algorithm]\nname = "rloo"\nnorm_adv_by_std = false\n', registry=only_this
        )
    errors = [e for e in info.value.errors if e.startswith("algorithm")]
    assert len(errors) == 1
    assert errors[0].startswith("algorithm.norm_adv_by_std: unknown key")
    assert "\n" not in errors[0]


def make_batch(seed: int, rows: int = 40, length: int = 6) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    uids: list[str] = []
    while len(uids) < rows:
        uids.extend([f"q{len(uids)}"] * int(torch.randint(1, 6, (1,), generator=gen)))
    uids = uids[:rows]
    perm = torch.randperm(rows, generator=gen).tolist()
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = torch.randint(0, 3, (rows, length), generator=gen).float() / 2 * mask
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array([uids[i] for i in perm], dtype=object)},
    )


@pytest.mark.parametrize("seed", range(3))
def test_rloo_advantages_with_shuffled_groups(rloo_cls, seed):
    batch = make_batch(seed)
    rewards = batch.batch["token_level_rewards"].tolist()
    uids = list(batch.non_tensor_batch["uid"])
    out = rloo_cls(rloo_cls.Config()).compute_advantages(batch)
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    for i in range(len(uids)):
        others = [sum(rewards[j]) for j in range(len(uids)) if uids[j] == uids[i] and j != i]
        expected = sum(rewards[i]) - sum(others) / len(others) if others else 0.0
        for t in range(adv.shape[1]):
            assert abs(float(adv[i, t]) - expected * float(mask[i, t])) <= 1e-6
    assert torch.equal(out.batch["returns"], adv)
