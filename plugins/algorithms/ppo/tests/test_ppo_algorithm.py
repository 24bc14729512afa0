"""rlcore-ppo: discovery, Config, [algorithm] errors, GAE through DataProto against a plain-loop
float64 reference, and the value loss (values, gradient, split invariance, metrics)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import rlcore_ppo.plugin
from rlcore.config.convert import structure
from rlcore.config.loader import ConfigValidationError, load_config_text
from rlcore.interfaces import BaseAlgorithm, BatchTotals, ModelOutputs
from rlcore.plugins import PluginRegistry
from rlcore.protocol import DataProto


@pytest.fixture(scope="module")
def ppo_cls():
    registry = PluginRegistry()
    (entry,) = [e for e in registry.entries("algorithm") if e.name == "ppo"]
    assert entry.distribution == "rlcore-ppo"
    assert entry.target == "rlcore_ppo.algorithm:PPO"
    return registry.resolve("algorithm", "ppo")


def test_discovered_through_entry_point(ppo_cls):
    assert issubclass(ppo_cls, BaseAlgorithm)
    assert ppo_cls.__name__ == "PPO"


def test_plugin_module_imports_nothing_heavy():
    code = "import sys, rlcore_ppo.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_defaults_validate(ppo_cls):
    cfg, problems = structure({}, ppo_cls.Config, ("algorithm",))
    assert problems == []
    assert (cfg.gamma, cfg.lam, cfg.cliprange_value) == (1.0, 1.0, 0.5)
    assert cfg.value_loss_agg_mode == "token-mean"
    algo = ppo_cls(cfg)
    assert algo.needs_critic
    assert not algo.needs_reference


def _algorithm_errors(text: str) -> list[str]:
    only_this = PluginRegistry(entry_points=False)
    only_this.register(rlcore_ppo.plugin, name="ppo")
    with pytest.raises(ConfigValidationError) as info:
        load_config_text(text, registry=only_this)
    return [e for e in info.value.errors if e.startswith("algorithm")]


def test_unknown_option_is_one_line_with_key_path():
    errors = _algorithm_errors('[algorithm]\nname = "ppo"\nlamda = 0.95\n')
    assert errors == ["algorithm.lamda: unknown key (did you mean 'lam'?)"]
    errors = _algorithm_errors('[algorithm]\nname = "ppo"\ngamma = 1.5\n')
    assert errors == ["algorithm.gamma: must be <= 1.0, got 1.5"]


def make_batch(seed: int, rows: int = 10, length: int = 9) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0
    lengths[1] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    mask[2, 1] = 0.0  # a hole inside a response
    return DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "token_level_rewards": torch.randn(rows, length, generator=gen, dtype=torch.float64)
            * mask,
            "values": torch.randn(rows, length, generator=gen, dtype=torch.float64),
        }
    )


def ref_gae(r, v, m, gamma, lam):
    adv = [[0.0] * len(r[0]) for _ in r]
    for i in range(len(r)):
        nv, last = 0.0, 0.0
        for t in reversed(range(len(r[0]))):
            g = r[i][t] + gamma * nv - v[i][t] + gamma * lam * last
            if m[i][t]:
                nv, last = v[i][t], g
            adv[i][t] = last
    vals = [adv[i][t] for i in range(len(r)) for t in range(len(r[0])) if m[i][t]]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1) + 1e-8)
    white = [[(adv[i][t] - mean) / std * m[i][t] for t in range(len(r[0]))] for i in range(len(r))]
    ret = [[(adv[i][t] + v[i][t]) * m[i][t] for t in range(len(r[0]))] for i in range(len(r))]
    return white, ret


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95)])
def test_gae_advantages_through_dataproto(ppo_cls, gamma, lam):
    batch = make_batch(0)
    b = {k: v.tolist() for k, v in batch.batch.items()}
    out = ppo_cls(ppo_cls.Config(gamma=gamma, lam=lam)).compute_advantages(batch)
    ref_adv, ref_ret = ref_gae(
        b["token_level_rewards"], b["values"], b["response_mask"], gamma, lam
    )
    assert (
        float((out.batch["advantages"] - torch.tensor(ref_adv, dtype=torch.float64)).abs().max())
        <= 1e-6
    )
    assert (
        float((out.batch["returns"] - torch.tensor(ref_ret, dtype=torch.float64)).abs().max())
        <= 1e-6
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_value_loss_through_dataproto(ppo_cls, mode):
    batch = make_batch(1, rows=12)
    algo = ppo_cls(ppo_cls.Config(cliprange_value=0.3, value_loss_agg_mode=mode))
    batch = algo.compute_advantages(batch)
    gen = torch.Generator().manual_seed(2)
    vpreds = batch.batch["values"] + 0.5 * torch.randn(12, 9, generator=gen, dtype=torch.float64)
    mask = batch.batch["response_mask"]
    totals = BatchTotals(tokens=int(mask.sum()), sequences=12, max_response_length=9)

    def grad(splits):
        leaf = vpreds.clone().requires_grad_(True)
        metrics = []
        for rows in splits:
            loss, m = algo.value_loss(
                ModelOutputs(values=leaf[torch.tensor(rows)]), batch[rows], totals
            )
            loss.backward()
            metrics.append(m)
        return leaf.grad, metrics

    whole, (m_whole,) = grad([list(range(12))])
    split, _ = grad([[0, 3, 4], [1, 2, 5, 6, 7, 8], [9, 10, 11]])
    assert float((whole - split).abs().max()) <= 1e-12

    # reference: 0.5 * max((v - R)^2, (v_clip - R)^2), aggregated, and its derivative
    v, r, old, m = (
        x.tolist() for x in (vpreds, batch.batch["returns"], batch.batch["values"], mask)
    )
    total, clipped, count = 0.0, 0.0, 0.0
    ref_grad = [[0.0] * 9 for _ in range(12)]
    for i in range(12):
        n_i = sum(m[i])
        for t in range(9):
            if not m[i][t]:
                continue
            w = 1.0 / totals.tokens if mode == "token-mean" else 1.0 / (n_i * 12)
            vc = min(max(v[i][t], old[i][t] - 0.3), old[i][t] + 0.3)
            l1, l2 = (v[i][t] - r[i][t]) ** 2, (vc - r[i][t]) ** 2
            total += 0.5 * max(l1, l2) * w
            ref_grad[i][t] = (v[i][t] - r[i][t]) * w if l1 >= l2 else 0.0
            clipped += float(l2 > l1)
            count += 1
    assert abs(m_whole["critic/vf_loss"] - total) <= 1e-6
    assert abs(m_whole["critic/vf_clipfrac"] - clipped / count) <= 1e-6
    assert float((whole - torch.tensor(ref_grad, dtype=torch.float64)).abs().max()) <= 1e-6


def test_value_loss_needs_values(ppo_cls):
    batch = make_batch(3)
    algo = ppo_cls(ppo_cls.Config())
    with pytest.raises(ValueError, match=r"outputs\.values"):
        algo.value_loss(
            ModelOutputs(), batch, BatchTotals(tokens=1, sequences=1, max_response_length=9)
        )
