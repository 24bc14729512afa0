"""A policy loss and an advantage estimator added from outside rlcore, by name.

``tests/data/custom-rl`` is a third-party distribution (committed, found through its
``entry_points.txt`` on the path, as ``tests/data/exit-reward``) that registers the loss
``custom_pg`` and the estimator ``group_size`` through rlcore's hooks and edits nothing in
rlcore. Checked: discovery lists them with their distribution; a config naming them trains one
step of a real run (``rlcore train``: Ray workers, FSDP2, HF rollout) with each, seen in the
metrics (the loss's own metric, the estimator's advantages and the loss they give); a
misspelled name is one line naming the key and every registered name, before Ray starts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.interfaces import BatchTotals
from rlcore.plugins import PluginRegistry
from rlcore.rl.algorithm import PolicyGradientAlgorithm
from rlcore.rl.registry import (
    adv_estimator_names,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    policy_loss_names,
)

HERE = Path(__file__).resolve().parent
CUSTOM = HERE / "data" / "custom-rl"


def _env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    path = os.pathsep.join(filter(None, [str(CUSTOM), os.environ.get("PYTHONPATH")]))
    return environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": path}


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.syspath_prepend(str(CUSTOM))
    return PluginRegistry()


def test_discovered_with_its_distribution_and_the_core_names(registry):
    entries = {(e.kind, e.name): e for e in registry.entries()}
    loss = entries[("policy_loss", "custom_pg")]
    est = entries[("adv_estimator", "group_size")]
    assert (loss.distribution, loss.version) == ("rlcore-custom-rl", "0.1")
    assert est.target == "rlcore_custom_rl.rl:compute_group_size_advantage"
    assert "custom_pg" in policy_loss_names(registry)
    assert {"vanilla", "gmpo"} <= set(policy_loss_names(registry))
    assert {"group_size", "gae", "grpo"} <= set(adv_estimator_names(registry))
    assert registry.check(loss) == "ok"


def test_the_plugin_module_passes_the_conformance_check():
    from rlcore.testing.conformance import check_plugin_module

    assert check_plugin_module("rlcore_custom_rl.plugin", sys_path=[CUSTOM]) == {
        "policy_loss/custom_pg": "rlcore_custom_rl.rl:compute_policy_loss_custom_pg",
        "adv_estimator/group_size": "rlcore_custom_rl.rl:compute_group_size_advantage",
    }


def test_the_functions_resolve_and_follow_the_signatures(registry):
    loss_fn = get_policy_loss_fn("custom_pg", registry=registry)
    est_fn = get_adv_estimator_fn("group_size", registry=registry)
    assert loss_fn.__module__ == "rlcore_custom_rl.rl"
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    rewards = torch.zeros(3, 3)
    config = PolicyGradientAlgorithm.Config(clip_ratio_high=0.37)
    adv, ret = est_fn(rewards, mask, config=config, index=["a", "a", "b"])
    assert torch.equal(adv, torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.0, 0.0], [0.25] * 3]))
    assert torch.equal(ret, adv)
    log_prob = torch.full((3, 3), -1.0, requires_grad=True)
    totals = BatchTotals(tokens=6, sequences=3, max_response_length=3)
    loss, metrics = loss_fn(
        log_prob.detach(), log_prob, adv, mask, loss_agg_mode="token-mean", config=config,
        totals=totals,
    )  # fmt: skip
    # on-policy: ratio 1, so the token-mean loss is -mean(A) over the 6 valid tokens
    assert loss.item() == pytest.approx(-(0.5 * 3 + 0.25 * 3) / 6)
    assert metrics["actor/custom_pg_clip_ratio_high"] == pytest.approx(0.37)
    assert metrics["actor/pg_loss"] == pytest.approx(loss.item())


# --- a real run, in its own process (its Ray workers find the plugin through PYTHONPATH) ------


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("custom_rl")
    model = tiny_run_model(root / "model")
    data = write_jsonl(
        arithmetic_rows([(a, b) for a in range(3) for b in range(3)]), root / "t.jsonl"
    )
    return model, data


def _config(assets, tmp_path: Path, options: str) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    model, data = assets
    cfg = tmp_path / "custom.toml"
    cfg.write_text(
        tiny_run_toml(
            model=model,
            train_files=[data],
            run_dir=tmp_path / "run",
            algorithm="grpo",
            algorithm_options=options,
            total_steps=1,
            n=2,
            experiment_name="custom-rl",
        )
    )
    return cfg


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlcore.cli", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


@pytest.mark.slow
def test_one_step_trains_with_the_plugin_loss_and_estimator(assets, tmp_path):
    options = 'policy_loss = "custom_pg"\nadv_estimator = "group_size"\nclip_ratio_high = 0.37\n'
    proc = _cli("train", str(_config(assets, tmp_path, options)), timeout=540)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if r["step"] == 1]
    # The loss ran in the workers: its own metric, with the Config value it read.
    assert step["actor/custom_pg_clip_ratio_high"] == pytest.approx(0.37)
    # The estimator's advantages were used: groups of n = 2 give 0.5 on every valid token
    # (the GSM8K reward scores this random model 0, so GRPO's own advantages would be 0).
    for stat in ("mean", "max", "min"):
        assert step[f"critic/advantages/{stat}"] == pytest.approx(0.5)
    # and they reached the loss: -A * ratio, ratio 1 on the first (on-policy) update.
    assert step["actor/pg_loss"] == pytest.approx(-0.5, abs=1e-3)
    assert math.isfinite(step["actor/grad_norm"])


def test_a_misspelled_name_is_one_line_before_ray_starts(assets, tmp_path):
    cfg = _config(assets, tmp_path, 'policy_loss = "custom_pgg"\nadv_estimator = "group_sise"\n')
    proc = _cli("train", str(cfg), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "algorithm." in ln]
    assert lines == [
        "  algorithm.policy_loss: unknown policy loss 'custom_pgg'. Registered: cispo, "
        "custom_pg, gmpo, gpg, gspo, kl_cov, sapo, vanilla.",
        "  algorithm.adv_estimator: unknown advantage estimator 'group_sise'. Registered: "
        "gae, group_size, grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo.",
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ray" not in proc.stderr.lower()  # refused while loading the config
    assert not (tmp_path / "run").exists()
