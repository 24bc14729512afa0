"""The config reference (rlcore.config.reference): docs/config.md is generated from the attrs
fields of the schema and of the installed plugins' Config classes, every key has help text,
and ``rlcore config explain KEY`` prints one key (the selected plugin's, for plugin keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.config.reference import core_keys, keys_without_help, plugin_keys, render_markdown
from rlcore.plugins import default_registry

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "config.md"
# The fake distributions of tests/data/fake-plugin (on pytest's pythonpath) are not part of
# the documented install.
FAKES = ("rlcore-fake", "rlcore-fake-dup")


@pytest.fixture(scope="module")
def registry():
    return default_registry(FAKES)


def test_docs_config_md_is_current(registry):
    expected = render_markdown(registry)
    assert DOC.read_text(encoding="utf-8") == expected, (
        "docs/config.md is stale: run `python -m rlcore.config.reference > docs/config.md`"
    )


def test_every_key_has_help_text(registry):
    missing = keys_without_help(registry)
    assert not missing, "keys without metadata={'help': ...}:\n" + "\n".join(missing)


def test_every_first_party_plugin_is_documented(registry):
    doc = DOC.read_text(encoding="utf-8")
    for kind, name in [
        ("engine", "fsdp2"),
        ("engine", "megatron"),
        ("rollout", "hf"),
        ("rollout", "vllm"),
        ("rollout", "sglang"),
        ("reward", "gsm8k"),
        ("reward", "math"),
        ("reward", "code"),
        ("algorithm", "grpo"),
        ("algorithm", "ppo"),
        ("algorithm", "rloo"),
        ("algorithm", "dapo"),
    ]:
        assert f"#### {kind} {name} (" in doc
        assert plugin_keys(registry, kind, name) or kind == "algorithm"


def test_type_default_and_allowed_values_come_from_the_schema(registry):
    docs = {d.key: d for d in core_keys(registry)}
    lr = docs["actor.optim.lr"]
    assert (lr.type, lr.default, lr.allowed) == ("float", "1e-06", "> 0.0")
    top_p = docs["rollout.top_p"]
    assert top_p.allowed == "> 0.0, <= 1.0"
    truncation = docs["data.truncation"]
    assert (truncation.type, truncation.default) == ("string", '"error"')
    assert truncation.allowed == 'one of "error", "left", "right"'
    assert docs["data.train_files"].default == "required"
    assert docs["model.tokenizer_path"].default == "model.path"  # resolved from another key
    assert docs["ref.engine.name"].default == "actor.engine.name"
    assert docs["data.val_batch_size"].allowed == ">= 1 (or unset)"
    assert docs["trainer.loggers"].type == "array of string"
    assert "console" in docs["trainer.loggers"].allowed
    assert docs["roles.<name>.model.path"].type == "string"
    # A plugin's key: its validator's bounds and a registry-checked name.
    grpo = {d.key: d for d in plugin_keys(registry, "algorithm", "grpo")}
    assert grpo["algorithm.clip_ratio_low"].allowed == ">= 0.0, < 1.0"
    assert "vanilla" in grpo["algorithm.policy_loss"].allowed
    assert grpo["algorithm.clip_ratio_low"].owner == "algorithm grpo (rlcore-grpo)"
    gsm8k = {d.key: d for d in plugin_keys(registry, "reward", "gsm8k")}
    assert gsm8k["reward.options.gsm8k.method"].allowed == 'one of "strict", "flexible"'


def test_explain_a_core_key(capsys):
    assert main(["config", "explain", "actor.optim.lr"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == [
        "actor.optim.lr",
        "  type:     float",
        "  default:  1e-06",
        "  allowed:  > 0.0",
    ]
    assert "effect:   Peak learning rate of AdamW" in out


def test_explain_a_plugin_key_follows_the_selected_plugin(tmp_path, capsys):
    # By default [algorithm] is grpo: its clip_ratio_high is 0.2; DAPO's is 0.28.
    assert main(["config", "explain", "algorithm.clip_ratio_high"]) == 0
    out = capsys.readouterr().out
    assert "  default:  0.2\n" in out
    assert "defined by: algorithm grpo (rlcore-grpo)" in out
    run = tmp_path / "run.toml"
    run.write_text('[algorithm]\nname = "dapo"\n')
    assert main(["config", "explain", "algorithm.clip_ratio_high", "--config", str(run)]) == 0
    out = capsys.readouterr().out
    assert "  default:  0.28\n" in out
    assert "defined by: algorithm dapo (rlcore-dapo)" in out


def test_explain_a_key_of_another_plugin_names_it(capsys):
    assert main(["config", "explain", "algorithm.lam"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: algorithm.lam is an option of algorithm ppo, not of the plugin selected by "
        "default (algorithm grpo)\n"
    )


def test_explain_an_unknown_key_names_the_nearest(capsys):
    assert main(["config", "explain", "actor.optim.lrr"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "error: unknown config key 'actor.optim.lrr'; did you mean actor.optim.lr"
    )


def test_explain_a_table_lists_its_keys(capsys):
    assert main(["config", "explain", "rollout.val"]) == 0
    assert capsys.readouterr().out == (
        "rollout.val: a table; its keys: n, temperature, top_p, top_k, do_sample\n"
    )


def test_explain_reward_and_role_keys(capsys):
    assert main(["config", "explain", "reward.options.math.timeout_s"]) == 0
    assert "defined by: reward math (rlcore-math)" in capsys.readouterr().out
    assert main(["config", "explain", "roles.teacher.model.path"]) == 0
    assert capsys.readouterr().out.startswith("roles.<name>.model.path\n")
