"""The ``rlcore`` command: exit codes, one-line errors, tables, resolved config, Ray arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import rlcore_fake.good

from rlcore.cli import main
from rlcore.config.schema import ResourcesConfig
from rlcore.errors import ResourceError
from rlcore.plugins import PluginRegistry
from rlcore.workers.cluster import ray_init_kwargs

REPO = Path(__file__).resolve().parents[2]

CONFIG = """
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


@pytest.fixture
def registry():
    reg = PluginRegistry(entry_points=False)
    reg.register(rlcore_fake.good)
    return reg


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path


def test_validate_ok(config, registry, capsys):
    assert main(["config", "validate", str(config)], registry=registry) == 0
    assert capsys.readouterr().out == f"ok: {config} is valid\n"


def test_validate_reports_every_error_exit_2(config, registry, capsys):
    code = main(
        ["config", "validate", str(config), "actor.optim.lr=-1", "rollout.temprature=1"],
        registry=registry,
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {config}: 2 errors\n"
        "  actor.optim.lr: must be > 0.0, got -1.0\n"
        "  rollout.temprature: unknown key (did you mean 'temperature'?)\n"
    )


def test_missing_file_is_one_line(tmp_path, registry, capsys):
    assert main(["config", "validate", str(tmp_path / "no.toml")], registry=registry) == 2
    assert capsys.readouterr().err == f"error: config file '{tmp_path / 'no.toml'}' not found\n"


def test_debug_shows_the_traceback(tmp_path, registry, capsys):
    assert (
        main(["--debug", "config", "validate", str(tmp_path / "no.toml")], registry=registry) == 2
    )
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.endswith(f"error: config file '{tmp_path / 'no.toml'}' not found\n")


def test_show_prints_the_resolved_config(config, registry, capsys):
    assert main(["config", "show", str(config), "rollout.n=2"], registry=registry) == 0
    shown = tomllib.loads(capsys.readouterr().out)
    assert shown["rollout"]["n"] == 2
    assert shown["actor"]["ppo_mini_batch_size"] == 4  # defaults included
    assert shown["actor"]["engine"] == {"name": "fake", "reshard_after_forward": True, "shards": 1}
    assert shown["trainer"]["run_dir"] == "runs/rlcore"


def test_train_names_the_missing_plugin_and_how_to_install(config, registry, capsys):
    code = main(["train", str(config), "actor.engine.name=fsdp2"], registry=registry)
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: {config}: actor.engine.name: engine 'fsdp2' is not installed. "
        "Install it with: pip install rlcore-fsdp2\n"
    )


def test_plugins_table(registry, capsys):
    registry.register(object(), name="nothing")  # a plugin without hooks is fine
    assert main(["plugins"], registry=registry) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "STATUS"]
    assert lines[1].split() == ["engine", "fake", "-", "-", "ok"]


def test_plugins_table_of_installed_distributions():
    # Through the console script in a subprocess: the fake distributions on PYTHONPATH.
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests" / "data" / "fake-plugin")}
    env.pop("RLCORE_DISABLE_PLUGINS", None)  # the CLI maps it onto [plugins] disabled
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "plugins"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(None, 4) for line in proc.stdout.splitlines()]
    assert ["engine", "fake", "rlcore-fake", "0.1", "ok"] in rows
    assert ["reward", "fake_dup", "rlcore-fake-dup", "0.2", "duplicate"] in rows
    # Each target is resolved (module found, class present), not just listed.
    assert [
        "rollout",
        "fake_missing",
        "rlcore-fake",
        "0.1",
        "import error: No module named 'rlcore_fake_missing_backend'",
    ] in rows
    assert [
        "-",
        "fake_broken",
        "rlcore-fake",
        "0.1",
        "import error: No module named 'rlcore_fake_nonexistent_dependency'",
    ] in rows
    assert [
        "-",
        "fake_typo",
        "rlcore-fake",
        "0.1",
        "unknown hook 'register_engine' (did you mean 'register_engines'?)",
    ] in rows
    assert proc.stderr == ""  # the table says it all; no repeated warnings


def test_usage_error_exit_code(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["nonsense"])
    assert exc.value.code == 2


# --- Ray: local and private by default, or join a cluster ------------------------------------


def test_ray_local_by_default():
    kwargs = ray_init_kwargs(ResourcesConfig(processes_per_node=2), environ={})
    assert kwargs["address"] == "local"
    assert kwargs["include_dashboard"] is False
    assert kwargs["_node_ip_address"] == "127.0.0.1"
    assert kwargs["num_cpus"] >= 3


def test_ray_address_from_env_wins():
    resources = ResourcesConfig(ray_address="10.0.0.1:6379", nnodes=2)
    assert ray_init_kwargs(resources, environ={"RAY_ADDRESS": "auto"}) == {"address": "auto"}
    assert ray_init_kwargs(resources, environ={}) == {"address": "10.0.0.1:6379"}


def test_several_nodes_need_a_cluster():
    with pytest.raises(ResourceError) as exc:
        ray_init_kwargs(ResourcesConfig(nnodes=2), environ={})
    assert str(exc.value) == (
        "resources.nnodes = 2 needs a Ray cluster: start one (ray start --head on the first "
        "node, ray start --address=... on the others) and set RAY_ADDRESS or resources.ray_address"
    )


def test_plugins_table_imports_no_backend():
    # Every installed target is resolved (module found, class present) by reading its
    # source: listing plugins must not import torch, transformers or Ray.
    code = (
        "import sys, io, contextlib; from rlcore.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out: main(['plugins'])\n"
        "assert ' ok' in out.getvalue(), out.getvalue()\n"
        "heavy = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
