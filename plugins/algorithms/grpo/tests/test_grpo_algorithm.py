"""rlcore-grpo: discovery, Config, [algorithm] errors, and GRPO / Dr. GRPO / REINFORCE++
advantages through DataProto with shuffled groups, against plain-loop float64 references."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import rlcore_grpo.algorithm
import rlcore_grpo.plugin
from rlcore.config.convert import structure
from rlcore.config.loader import ConfigValidationError, load_config_text
from rlcore.interfaces import BaseAlgorithm
from rlcore.plugins import PluginRegistry
from rlcore.protocol import DataProto


@pytest.fixture(scope="module")
def registry():
    return PluginRegistry()


def test_discovered_through_entry_point(registry):
    for name, cls_name in [("grpo", "GRPO"), ("reinforce_plus_plus", "ReinforcePlusPlus")]:
        (entry,) = [e for e in registry.entries("algorithm") if e.name == name]
        assert entry.distribution == "rlcore-grpo"
        assert entry.target == f"rlcore_grpo.algorithm:{cls_name}"
        cls = registry.resolve("algorithm", name)
        assert issubclass(cls, BaseAlgorithm)
        assert cls.__name__ == cls_name


def test_plugin_module_imports_nothing_heavy():
    code = "import sys, rlcore_grpo.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["grpo", "reinforce_plus_plus"])
def test_config_defaults_validate(registry, name):
    cls = registry.resolve("algorithm", name)
    cfg, problems = structure({}, cls.Config, ("algorithm",))
    assert problems == []
    algo = cls(cfg)
    assert not algo.needs_critic
    assert not algo.needs_reference
    if name == "grpo":
        assert (cfg.norm_adv_by_std, cfg.epsilon) == (True, 1e-6)
    else:
        assert (cfg.adv_estimator, cfg.gamma) == ("reinforce_plus_plus", 1.0)
    cfg, problems = structure({"use_kl_loss": True}, cls.Config, ("algorithm",))
    assert cls(cfg).needs_reference


def _algorithm_errors(text: str) -> list[str]:
    # Only this plugin registered: other sections' errors (no engine, rollout, reward) are
    # filtered out, and no other plugin is imported.
    only_this = PluginRegistry(entry_points=False)
    only_this.register(rlcore_grpo.plugin, name="grpo")
    with pytest.raises(ConfigValidationError) as info:
        load_config_text(text, registry=only_this)
    return [e for e in info.value.errors if e.startswith("algorithm")]


def test_unknown_option_is_one_line_with_key_path():
    errors = _algorithm_errors('[algorithm]\nname = "grpo"\nnorm_adv_by_sdt = false\n')
    assert errors == ["algorithm.norm_adv_by_sdt: unknown key (did you mean 'norm_adv_by_std'?)"]
    errors = _algorithm_errors('[algorithm]\nname = "grpo"\nkl_ctrl = {target = 0.1}\n')
    assert len(errors) == 1
    assert errors[0].startswith("algorithm.kl_ctrl.target: unknown key")
    errors = _algorithm_errors('[algorithm]\nname = "grpo"\nclip_ratio_c = 0.5\n')
    assert errors == ["algorithm.clip_ratio_c: must be > 1.0, got 0.5"]


def test_new_loss_modes_from_the_config_file():
    # The options of issue 11 reach GRPO's Config from TOML, and bad values are one line each.
    cfg, problems = structure(
        {
            "policy_loss": "cispo",
            "loss_agg_mode": "token-sum",
            "rollout_is": "sequence",
            "rollout_is_cap": 3.0,
        },
        rlcore_grpo.algorithm.GRPO.Config,
        ("algorithm",),
    )
    assert problems == []
    assert (cfg.policy_loss, cfg.loss_agg_mode, cfg.rollout_is, cfg.rollout_is_cap) == (
        "cispo", "token-sum", "sequence", 3.0,
    )  # fmt: skip
    errors = _algorithm_errors('[algorithm]\nname = "grpo"\nrollout_is = "seq"\n')
    assert len(errors) == 1
    assert errors[0].startswith("algorithm.rollout_is: must be one of")
    errors = _algorithm_errors('[algorithm]\nname = "grpo"\npolicy_loss = "geo_mean"\n')
    assert len(errors) == 1
    assert "gmpo" in errors[0]


# --- advantages through DataProto ---------------------------------------------------------


def make_batch(seed: int, rows: int = 48, length: int = 7) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    sizes, uids = [], []
    while len(uids) < rows:
        size = int(torch.randint(1, 6, (1,), generator=gen))  # groups of one included
        uids.extend([f"q{len(sizes)}"] * size)
        sizes.append(size)
    uids = uids[:rows]
    perm = torch.randperm(rows, generator=gen).tolist()
    uids = [uids[i] for i in perm]  # shuffled: a group's rows are not contiguous
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(rows, length)
    for i in range(rows):
        # binary-ish scores: ties and zero-variance groups are common
        rewards[i, max(int(lengths[i]) - 1, 0)] = (
            float(torch.randint(0, 3, (1,), generator=gen)) / 2
        )
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def ref_grpo(rewards: list[list[float]], uids: list[str], norm: bool, eps: float = 1e-6):
    scores = [sum(r) for r in rewards]
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(uids):
        groups.setdefault(u, []).append(i)
    adv = [0.0] * len(scores)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        mean = sum(scores[i] for i in rows) / len(rows)
        std = math.sqrt(sum((scores[i] - mean) ** 2 for i in rows) / (len(rows) - 1))
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return adv


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_advantages_with_shuffled_groups(registry, seed, norm):
    cls = registry.resolve("algorithm", "grpo")
    batch = make_batch(seed)
    out = cls(cls.Config(norm_adv_by_std=norm)).compute_advantages(batch)
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    ref = ref_grpo(
        batch.batch["token_level_rewards"].tolist(), list(batch.non_tensor_batch["uid"]), norm
    )
    for i in range(len(batch)):
        for t in range(adv.shape[1]):
            assert abs(float(adv[i, t]) - ref[i] * float(mask[i, t])) <= 1e-6
    assert torch.equal(out.batch["returns"], adv)


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_reinforce_plus_plus_through_dataproto(registry, estimator):
    cls = registry.resolve("algorithm", "reinforce_plus_plus")
    batch = make_batch(9)
    out = cls(cls.Config(adv_estimator=estimator)).compute_advantages(batch)
    adv, mask = out.batch["advantages"], out.batch["response_mask"]
    valid = adv[mask > 0]
    # whitened over the valid tokens: mean 0, unbiased std 1 (up to the 1e-8 in the sqrt)
    assert abs(float(valid.double().mean())) <= 1e-5
    assert abs(float(valid.double().std()) - 1.0) <= 1e-4
    assert float(adv[mask == 0].abs().max()) == 0.0


def test_grpo_missing_uid_is_named(registry):
    cls = registry.resolve("algorithm", "grpo")
    batch = make_batch(0)
    batch.non_tensor_batch.pop("uid")
    with pytest.raises(KeyError, match="uid"):
        cls(cls.Config()).compute_advantages(batch)
