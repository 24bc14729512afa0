"""Declared capabilities and versioned plugin contracts (issue 25, items 3 and 4).

- ``tests/data/old-engine`` is an engine distribution written for contract 1 (its
  ``forward_backward`` takes no ``temperature``, its plugin module declares no
  ``contract_version``), found through its committed ``.dist-info`` on ``PYTHONPATH`` as a
  pip-installed one is: ``rlcore train`` on a config naming it stops at validation, before
  anything imports Ray, with one line naming the change.
- ``tests/data/note-engine`` is turn 3's engine: a round-1 engine that followed only
  ``forward_backward``'s line of the note (it declares contract 2 but keeps
  ``optimizer_step()`` and ``compute_log_prob(batch)``). Both are refused before Ray with one
  line naming every parameter to add; copies migrated by the note's changelog train.
- An algorithm defined here, registered through an in-process plugin object, declares
  ``needs.reference`` (and nothing through the one-flag properties): the run builds a
  reference worker for it, and its KL loss is 0 at step 1 (the actor is the reference) and
  not 0 once the actor moved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from rlcore.errors import PluginError
from rlcore.hookspecs import hookimpl
from rlcore.interfaces import (
    CONTRACT_CHANGES,
    CONTRACT_VERSION,
    AlgorithmNeeds,
    BaseAlgorithm,
    BaseRollout,
    RolloutTraits,
)
from rlcore.plugins import PluginRegistry, contract_refusal

HERE = Path(__file__).resolve().parent
OLD_ENGINE = HERE / "data" / "old-engine"
NOTE_ENGINE = HERE / "data" / "note-engine"
NOTE = "see core/README.md, Contract versions"


# --- the algorithm a third party writes (defined here, registered in-process) ---------------


class KLToReference(BaseAlgorithm):
    """GRPO advantages, a plain policy-gradient loss, a k2 KL loss to the reference and an
    entropy bonus (a random model scores 0 everywhere: the bonus is what moves the actor).

    It declares what it needs through ``needs`` only; ``needs_reference`` keeps the base
    class's False, so a core that read the one-flag property would build no reference.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseAlgorithm.Config):
        kl_loss_coef: float = 0.1
        entropy_coeff: float = 0.5

    config: KLToReference.Config

    @property
    def needs(self) -> AlgorithmNeeds:
        return AlgorithmNeeds(reference=True, entropy=True)

    def compute_advantages(self, batch):
        from rlcore.rl.advantages import compute_grpo_outcome_advantage

        advantages, returns = compute_grpo_outcome_advantage(
            batch.batch["token_level_rewards"],
            batch.batch["response_mask"],
            batch.non_tensor_batch["uid"],
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch

    def policy_loss(self, outputs, batch, totals):
        import torch

        from rlcore.rl.kl import kl_penalty

        log_prob = outputs.log_probs
        mask = batch.batch["response_mask"].to(log_prob.dtype)
        tokens = max(totals.tokens, 1)
        ratio = torch.exp(log_prob - batch.batch["old_log_probs"].to(log_prob.dtype))
        pg = -(batch.batch["advantages"].to(log_prob.dtype) * ratio * mask).sum() / tokens
        kl = kl_penalty(log_prob, batch.batch["ref_log_prob"].to(log_prob.dtype), "k2") * mask
        entropy = outputs.entropy * mask
        cfg = self.config
        loss = (
            pg + cfg.kl_loss_coef * kl.sum() / tokens - cfg.entropy_coeff * entropy.sum() / tokens
        )
        local = max(float(mask.sum()), 1.0)  # this micro-batch's own means, for the metrics
        metrics = {
            "actor/pg_loss": float(pg.detach()) * tokens / local,
            "actor/kl_loss": float(kl.detach().sum()) / local,
            "actor/entropy": float(entropy.detach().sum()) / local,
        }
        return loss, metrics


class ContractsTestPlugin:
    """The in-process plugin object that registers :class:`KLToReference`."""

    contract_version = CONTRACT_VERSION

    @staticmethod
    @hookimpl
    def register_algorithms():
        return {"kl_to_reference": KLToReference}


# --- contract versions: the refusal line ----------------------------------------------------


def test_contract_refusal_names_both_versions_the_change_and_the_note():
    assert contract_refusal(CONTRACT_VERSION) is None
    missing = contract_refusal(None)
    assert missing == (
        "written for plugin contract 1 (it declares no contract_version), this rlcore "
        f"implements contract {CONTRACT_VERSION} (contract 2: {CONTRACT_CHANGES[2]}); {NOTE}"
    )
    assert contract_refusal(1) == missing.replace(" (it declares no contract_version)", "")
    assert "temperature" in CONTRACT_CHANGES[2]
    newer = contract_refusal(CONTRACT_VERSION + 1)
    assert newer == (
        f"written for plugin contract {CONTRACT_VERSION + 1}, newer than this rlcore's "
        f"contract {CONTRACT_VERSION}: upgrade rlcore ({NOTE})"
    )
    assert contract_refusal("2").startswith("its contract_version must be an int, got '2'")
    assert contract_refusal(True).startswith("its contract_version must be an int")


def _old_registry(*, strict: bool = False) -> PluginRegistry:
    """The installed plugins plus rlcore-old-engine, found through its .dist-info."""
    sys.path.insert(0, str(OLD_ENGINE))
    try:
        # The committed fake distributions (broken on purpose) are not the subject here.
        return PluginRegistry(strict=strict, disabled=["rlcore-fake", "rlcore-fake-dup"])
    finally:
        sys.path.remove(str(OLD_ENGINE))


def test_discovery_refuses_the_old_engine_and_resolving_it_is_one_line():
    reg = _old_registry()
    (problem,) = [p for p in reg.problems if p.distribution == "rlcore-old-engine"]
    assert (problem.status, problem.version, problem.plugin) == ("refused", "0.1", "old_engine")
    assert problem.reason == f"refused: {contract_refusal(None)}"
    assert "old_engine" not in reg.names("engine")
    refused = [(e.kind, e.name, e.distribution) for e, _ in reg.refused_entries()]
    assert refused == [("engine", "old_engine", "rlcore-old-engine")]
    with pytest.raises(PluginError) as exc:
        reg.resolve("engine", "old_engine", where="[actor.engine]")
    assert str(exc.value) == (
        "engine 'old_engine' in [actor.engine] is provided only by rlcore-old-engine 0.1, "
        f"whose plugin 'old_engine' is refused: {contract_refusal(None)}; also its methods do "
        "not take the parameters of plugin contract 2: forward_backward(add temperature)"
    )
    assert "\n" not in str(exc.value)
    assert "rlcore_old_engine.engine" not in sys.modules  # refused without importing it
    # The installed first-party plugins all declare the current contract.
    assert not [p for p in reg.problems if p.status == "refused" and p is not problem]
    with pytest.raises(PluginError, match="plugin 'old_engine' is refused: written for"):
        _old_registry(strict=True)


def test_in_process_plugins_are_checked_when_they_declare_a_version():
    class Declared:
        contract_version = 1

        @staticmethod
        @hookimpl
        def register_algorithms():
            return {"declared_old": KLToReference}

    class Undeclared:  # a test's or notebook's plugin object: trusted
        @staticmethod
        @hookimpl
        def register_algorithms():
            return {"undeclared": KLToReference}

    reg = PluginRegistry(entry_points=False)
    reg.register(Declared(), name="declared")
    reg.register(Undeclared(), name="undeclared")
    reg.register(ContractsTestPlugin(), name="current")
    assert reg.names("algorithm") == ["kl_to_reference", "undeclared"]
    assert [p.status for p in reg.problems] == ["refused"]
    with pytest.raises(PluginError) as exc:
        reg.resolve("algorithm", "declared_old")
    assert str(exc.value) == (
        "algorithm 'declared_old' is provided only by plugin 'declared', which is refused: "
        f"{contract_refusal(1)}"
    )


def _engines_env(*roots: Path) -> dict[str, str]:
    paths = [*map(str, roots), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _old_engine_env() -> dict[str, str]:
    return _engines_env(OLD_ENGINE, NOTE_ENGINE)


# Each engine's refusal: everything its methods lack, named before Ray.
SIGNATURES = "its methods do not take the parameters of plugin contract 2: "
REFUSALS = {
    "old_engine": (
        "engine 'old_engine' is provided only by rlcore-old-engine 0.1, whose plugin "
        f"'old_engine' is refused: {contract_refusal(None)}; also {SIGNATURES}"
        "forward_backward(add temperature)"
    ),
    "note_engine": (
        "engine 'note_engine' (rlcore_note_engine.engine:NoteEngine) from rlcore-note-engine "
        f"0.1: {SIGNATURES}compute_log_prob(add temperature); optimizer_step(add lr) ({NOTE})"
    ),
}


def _train_config(tmp_path: Path, engine: str, *, model: Path | None = None) -> Path:
    from rlcore.testing.runs import arithmetic_rows, tiny_run_toml, write_jsonl

    train = write_jsonl(arithmetic_rows([(1, 2), (3, 4)]), tmp_path / "train.jsonl")
    config = tmp_path / f"{engine}.toml"
    config.write_text(
        tiny_run_toml(
            model=model or tmp_path / "model",  # never read when validation stops first
            train_files=[train],
            run_dir=tmp_path / "run",
            total_steps=1,
            train_batch_size=2,
            extra=f'[actor.engine]\nname = "{engine}"\n',
        )
    )
    return config


@pytest.mark.parametrize("engine", sorted(REFUSALS))
def test_rlcore_train_on_an_old_engine_exits_2_with_one_line_before_ray(tmp_path, engine):
    config = _train_config(tmp_path, engine)
    # The console script's module under -X importtime: every import is reported on stderr,
    # so "before Ray starts" is measured, not assumed.
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rlcore.cli", "train", str(config)],
        env=_old_engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    imports = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    lines = [
        ln
        for ln in proc.stderr.splitlines()
        if not ln.startswith("import time:") and "rlcore-fake" not in ln
    ]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines == [f"error: {config}: actor.engine.name: {REFUSALS[engine]}"]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in imports}
    assert "rlcore.config" in imported  # the measurement sees rlcore's own imports
    assert not {m for m in imported if m == "ray" or m.startswith("ray.")}
    assert not (tmp_path / "run").exists()


def test_rlcore_plugins_lists_the_old_engines_as_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "plugins"],
        env=_old_engine_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (row,) = [ln for ln in proc.stdout.splitlines() if "rlcore-old-engine" in ln]
    assert row.split()[:5] == ["engine", "old_engine", "rlcore-old-engine", "0.1", "refused:"]
    assert row.endswith(
        f"refused: {contract_refusal(None)}; also {SIGNATURES}forward_backward(add temperature)"
    )
    # Declared current, but its source's methods are not: refused from the source, unimported.
    (row,) = [ln for ln in proc.stdout.splitlines() if "rlcore-note-engine" in ln]
    assert row.split()[:4] == ["engine", "note_engine", "rlcore-note-engine", "0.1"]
    assert row.endswith(
        f"refused: {SIGNATURES}compute_log_prob(add temperature); optimizer_step(add lr) ({NOTE})"
    )


# What the changelog of core/README.md ("Contract versions", "Migrating from 1 to 2") tells
# each engine's author to change, as edits of its files: (file, old text, new text).
MIGRATIONS = {
    "old_engine": (
        OLD_ENGINE,
        [
            (
                "rlcore_old_engine/plugin.py",
                "from rlcore.hookspecs import hookimpl\n",
                "from rlcore.hookspecs import hookimpl\n\ncontract_version = 2\n",
            ),
            (
                "rlcore_old_engine/engine.py",
                "loss_fn, *, with_entropy=False):",
                "loss_fn, *, temperature, with_entropy=False):",
            ),
            (
                "rlcore_old_engine/engine.py",
                "        temperature = 1.0  # contract 1",
                "        # contract 1",
            ),
        ],
    ),
    "note_engine": (
        NOTE_ENGINE,
        [
            (
                "rlcore_note_engine/engine.py",
                "def optimizer_step(self):",
                "def optimizer_step(self, *, lr):",
            ),
            (
                "rlcore_note_engine/engine.py",
                "        lr = self.spec.optim.lr  # round 1",
                "        # round 1",
            ),
            (
                "rlcore_note_engine/engine.py",
                "batch, *, with_entropy=False):",
                "batch, *, temperature, with_entropy=False):",
            ),
            (
                "rlcore_note_engine/engine.py",
                "        temperature = 1.0  # round 1",
                "        # round 1",
            ),
        ],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(MIGRATIONS))
def test_an_old_engine_migrated_by_the_note_trains(tmp_path, engine):
    import shutil

    from rlcore.testing.runs import tiny_run_model

    source, edits = MIGRATIONS[engine]
    copy = tmp_path / source.name
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, old, new in edits:
        path = copy / rel
        text = path.read_text()
        assert old in text, (rel, old)
        path.write_text(text.replace(old, new))
    config = _train_config(tmp_path, engine, model=tiny_run_model(tmp_path / "model"))
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "train", str(config)],
        env=_engines_env(copy),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if "actor/grad_norm" in r]
    assert step["step"] == 1
    # The update ran through the migrated optimizer_step, at the core's learning rate (the
    # tiny model scores 0 everywhere, so the gradient itself may be zero).
    assert step["actor/lr"] == pytest.approx(1e-3)
    assert "timing_s/update_actor" in step


# --- conformance: check_contract and check_signatures --------------------------------------


def test_conformance_refuses_the_old_engine_and_accepts_the_first_party_plugins():
    from rlcore.testing.conformance import (
        check_contract,
        check_plugin_module,
        check_signatures,
    )

    with pytest.raises(AssertionError) as exc:
        check_plugin_module("rlcore_old_engine.plugin", sys_path=[OLD_ENGINE], resolve=False)
    assert str(exc.value) == (
        "plugin module 'rlcore_old_engine.plugin': must declare contract_version = "
        f"{CONTRACT_VERSION} at module level: {contract_refusal(None)}"
    )
    sys.path.insert(0, str(OLD_ENGINE))
    try:
        from rlcore_old_engine.engine import OldEngine
    finally:
        sys.path.remove(str(OLD_ENGINE))
    with pytest.raises(AssertionError) as exc:
        check_signatures(OldEngine)
    assert str(exc.value) == (
        "rlcore_old_engine.engine.OldEngine: methods take the contract's parameters: "
        f"{SIGNATURES}forward_backward(add temperature) ({NOTE})"
    )
    for module in ("rlcore_fsdp2.plugin", "rlcore_hf.plugin", "rlcore_grpo.plugin"):
        assert check_contract(module) == CONTRACT_VERSION
    from rlcore_fsdp2.engine import FSDP2Engine
    from rlcore_grpo.algorithm import GRPO
    from rlcore_hf.rollout import HFRollout

    for cls in (FSDP2Engine, HFRollout, GRPO, KLToReference):
        check_signatures(cls)


def test_check_signatures_names_an_extra_required_keyword():
    from rlcore.testing.conformance import check_signatures

    class Strict(KLToReference):
        def policy_loss(self, outputs, batch, totals, *, scale):
            raise NotImplementedError

    with pytest.raises(AssertionError, match=r"policy_loss\(remove scale \(or give a default\)\)"):
        check_signatures(Strict)


# --- declared capabilities -------------------------------------------------------------------


def test_needs_defaults_gather_the_one_flag_properties():
    class OldStyle(BaseAlgorithm):  # overrides a one-flag property, as before contract 2
        @property
        def needs_reference(self):
            return True

        def compute_advantages(self, batch):
            return batch

        def policy_loss(self, outputs, batch, totals):
            raise NotImplementedError

    assert OldStyle().needs == AlgorithmNeeds(reference=True)
    assert AlgorithmNeeds() == AlgorithmNeeds(
        reference=False,
        critic=False,
        entropy=False,
        rollout_log_probs=False,
        old_log_probs_on_driver=True,  # conservative: keep the separate pass
        zero_advantage_rows_inert=False,
    )
    assert OldStyle().state_dict() == {}
    assert KLToReference().needs.reference
    assert not KLToReference().needs_reference


def test_policy_gradient_plugins_declare_their_needs():
    from rlcore_grpo.algorithm import GRPO
    from rlcore_ppo.algorithm import PPO

    assert GRPO().needs == AlgorithmNeeds(
        old_log_probs_on_driver=False, zero_advantage_rows_inert=True
    )
    kl_in_reward = GRPO(GRPO.Config(use_kl_in_reward=True, rollout_is="token"))
    assert kl_in_reward.needs == AlgorithmNeeds(
        reference=True,
        rollout_log_probs=True,
        old_log_probs_on_driver=True,
        zero_advantage_rows_inert=True,
    )
    assert GRPO(GRPO.Config(use_kl_loss=True)).needs.zero_advantage_rows_inert is False
    assert PPO().needs.critic


def test_rollout_traits_default_and_vllm():
    from rlcore_hf.rollout import HFRollout

    assert HFRollout.traits(HFRollout.Config()) == RolloutTraits()
    assert BaseRollout.traits(BaseRollout.Config()).ranks_per_engine == 1
    vllm_rollout = pytest.importorskip("rlcore_vllm.rollout")  # imports torch, not vllm
    cls = vllm_rollout.VLLMRollout
    assert cls.traits(cls.Config(tensor_parallel_size=2)) == RolloutTraits(
        cheap_log_probs=True, ranks_per_engine=2
    )


def _tiny_config(tmp_path: Path, registry: PluginRegistry, **kwargs):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_toml, write_jsonl

    train = write_jsonl(
        arithmetic_rows([(a, b) for a in range(4) for b in range(4)]), tmp_path / "train.jsonl"
    )
    text = tiny_run_toml(
        model=kwargs.pop("model", tmp_path / "model"),
        train_files=[train],
        run_dir=tmp_path / "run",
        algorithm="kl_to_reference",
        **kwargs,
    )
    return load_config_text(text, source="contracts.toml", registry=registry)


def _registry() -> PluginRegistry:
    reg = PluginRegistry()
    reg.register(ContractsTestPlugin(), name="contracts-test")
    return reg


def test_build_specs_reads_the_declared_needs_and_traits(tmp_path):
    from rlcore.trainer.builder import build_algorithm
    from rlcore.trainer.specs import build_specs

    reg = _registry()
    config = _tiny_config(tmp_path, reg)
    algorithm = build_algorithm(config, reg)
    specs = build_specs(config, algorithm, total_steps=2, registry=reg)
    assert specs.policy.ref is not None
    assert specs.policy.ref.spec.role == "ref"
    assert specs.policy.with_entropy
    assert not specs.policy.reuse_old_log_probs  # needs.old_log_probs_on_driver (default)
    assert not specs.train_sampling.return_log_probs  # the HF rollout's log-probs cost a pass
    # The in-process class travels to the workers with the spec; installed ones by name.
    assert specs.policy.algorithm.target is KLToReference
    assert specs.policy.actor.engine.target is None
    assert specs.policy.rollout.target is None


# --- end to end: the declared reference is built and used ------------------------------------


@pytest.mark.slow
def test_an_algorithm_declaring_needs_reference_gets_a_reference_worker(ray_session, tmp_path):
    from rlcore.testing.runs import tiny_run_model
    from rlcore.trainer import run_training

    reg = _registry()
    model = tiny_run_model(tmp_path / "model")
    # The reference engine takes the actor's engine and micro-batching (the schema resolves
    # [ref] from [actor]): at step 1 both hold the same weights and see the same rows.
    config = _tiny_config(tmp_path, reg, model=model, lr=5e-2)
    assert run_training(config, registry=reg) == 0

    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "actor/kl_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert "timing_s/ref" in train[0]  # the reference worker's pass ran
    assert train[0]["actor/kl_loss"] == 0.0
    assert train[1]["actor/kl_loss"] > 0.0
