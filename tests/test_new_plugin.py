"""``rlcore new-plugin KIND NAME``: each kind's package installs (pip, from its generated
pyproject), is listed by ``rlcore plugins`` through its entry point, and its generated test
(the kind's conformance check) passes as written."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing.scaffold import KINDS

pytestmark = pytest.mark.slow

NAMES = {kind: f"scaffold_{kind}" for kind in KINDS}


def _install(packages: list[Path], site: Path) -> None:
    """``pip install --no-deps`` into ``site`` (a folder put on PYTHONPATH, so the test's own
    interpreter is left as it was); without setuptools here (pip builds offline, from the
    interpreter's own backend), a ``.dist-info`` written from the generated pyproject."""
    if importlib.util.find_spec("setuptools") is not None:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        cmd += ["--no-build-isolation", "--target", str(site), *map(str, packages)]
        subprocess.run(cmd, check=True, timeout=300)
        return
    for pkg in packages:
        project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
        info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
        info.mkdir(parents=True)
        meta = f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
        (info / "METADATA").write_text(meta)
        points = project["entry-points"]["rlcore"]
        lines = "".join(f"{k} = {v}\n" for k, v in points.items())
        (info / "entry_points.txt").write_text(f"[rlcore]\n{lines}")


def test_each_kind_installs_is_listed_and_passes_its_generated_test(tmp_path, capsys):
    out = tmp_path / "plugins"
    for kind, name in NAMES.items():
        assert main(["new-plugin", kind, name, "--dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"pip install -e {out / NAMES['tool']}" in printed
    text = (out / NAMES["reward"] / "src" / NAMES["reward"] / "plugin.py").read_text()
    assert "contract_version = 2" in text

    site = tmp_path / "site"
    site.mkdir()
    _install([out / name for name in NAMES.values()], site)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    if importlib.util.find_spec("setuptools") is None:  # the dist-infos' packages, by path
        sources = [str(out / n / "src") for n in NAMES.values()]
        env["PYTHONPATH"] += os.pathsep + os.pathsep.join(sources)
    listed = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "plugins"],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    ).stdout  # fmt: skip
    for kind, name in NAMES.items():
        line = next((ln for ln in listed.splitlines() if f" {name} " in ln), "")
        words = line.split()
        assert words[:1] == [kind], listed
        assert words[-1] == "ok", listed

    tests = [str(out / name / "tests") for name in NAMES.values()]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=500, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "15 passed" in run.stdout  # two per kind, the algorithm's step too, run.stdout[-2000:]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["reward", "My-Reward"], "is not a lower-case Python identifier"),
        (["reward", "taken"], "exists already"),
    ],
)
def test_bad_names_are_one_line(tmp_path, capsys, args, expected):
    (tmp_path / "taken").mkdir()
    assert main(["new-plugin", *args, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("\n") == 1


def test_generated_plugins_of_each_kind_train_the_tiny_run_unchanged(tmp_path):
    """Every kind, as generated: installed (pip, as above) and named in the tiny run's TOML
    (engine in ``[actor.engine]``, rollout, reward, algorithm, the tool and the environment in
    ``[agent]``),
    one run trains a step through ``rlcore train`` (Ray workers find them on PYTHONPATH, as a
    user's pip install would put them on their path)."""
    import json
    import math

    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl

    # A harness replaces the built-in loop the tool and the environment join here: its
    # generated test runs it through the endpoint instead.
    names = {kind: f"scaffold_trained_{kind}" for kind in KINDS if kind != "harness"}
    out = tmp_path / "plugins"
    for kind, name in names.items():
        assert main(["new-plugin", kind, name, "--dir", str(out)]) == 0
    site = tmp_path / "site"
    site.mkdir()
    _install([out / name for name in names.values()], site)
    path = [str(site)]
    if importlib.util.find_spec("setuptools") is None:
        path += [str(out / name / "src") for name in names.values()]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")]))

    rows = arithmetic_rows([(a, b) for a in range(2) for b in range(2)])
    run_dir = tmp_path / "run"
    text = tiny_run_toml(
        model=tiny_run_model(tmp_path / "model"),
        train_files=[write_jsonl(rows, tmp_path / "t.jsonl")],
        run_dir=run_dir,
        total_steps=1,
        extra=f'[actor.engine]\nname = "{names["engine"]}"\n\n'
        f'[agent]\ntools = ["{names["tool"]}"]\nenvironment = "{names["environment"]}"\n',
    )
    for old, new in [
        ('name = "hf"', f'name = "{names["rollout"]}"'),
        ('default = ["gsm8k"]', f'default = ["{names["reward"]}"]'),
        ('name = "grpo"', f'name = "{names["algorithm"]}"'),
    ]:
        assert old in text, old
        text = text.replace(old, new, 1)
    config = tmp_path / "scaffolds.toml"
    config.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "train", str(config)],
        capture_output=True, text=True, env=env, timeout=300, start_new_session=True,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (step,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1
    # the generated reward scored every sample (its own scorer metric) ...
    assert f"reward/scorer/{names['reward']}/mean" in step, sorted(step)
    # ... the engine's forward_backward (the policy loss's metrics) and optimizer_step ran
    assert math.isfinite(step["actor/grad_norm"])
    assert math.isfinite(step["actor/pg_loss"])
    assert step["perf/weight_sync_bytes"] > 0  # its named_parameters_for_sync fed the rollout
    saved = tomllib.loads((run_dir / "config.toml").read_text())
    assert saved["rollout"]["name"] == names["rollout"]
    assert saved["algorithm"]["name"] == names["algorithm"]
    assert saved["agent"]["tools"] == [names["tool"]]
    assert saved["agent"]["environment"] == names["environment"]
    assert step["agent/env_errors"] == 0  # the generated environment stepped every turn
    # The generated engine's own checkpoint file (fsdp2 writes DCP shards instead) ...
    ckpt = run_dir / "checkpoints" / "global_step_1" / "actor" / f"{names['engine']}.pt"
    assert ckpt.is_file()
    # ... and its export (export_hf) is the run's final model.
    assert (run_dir / "final_hf" / "model.safetensors").is_file()


# --- issue 50 item 5: names and target folders, one line each ---------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["reward", "json"],
            "'json' is a standard-library module; a plugin package of that name would shadow "
            "it for every program of the environment; choose another NAME, e.g. my_json",
        ),
        (
            ["tool", "attrs"],
            "'attrs' is the import name of the installed distribution attrs; a plugin package "
            "of that name would replace it; choose another NAME, e.g. my_attrs",
        ),
        (
            ["reward", "a" * 300],
            "NAME is 300 characters long; at most 64 (it names a folder, a package and a test "
            "file)",
        ),
        (
            ["reward", "my_reward", "--dir", "{file}"],
            "--dir {file} is a file, not a folder; name a folder",
        ),
        (
            ["reward", "my_reward", "--dir", "/proc/rlcore-new-plugin"],
            "cannot create /proc/rlcore-new-plugin/my_reward: No such file or directory; "
            "choose a writable --dir",
        ),
    ],
)
def test_bad_plugin_names_and_folders_are_one_line(tmp_path, capsys, args, expected):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    args = [a.replace("{file}", str(blocker)) for a in args]
    if "--dir" not in args:
        args += ["--dir", str(tmp_path / "out")]
    assert main(["new-plugin", *args]) == 2
    err = capsys.readouterr().err
    assert err == f"error: new-plugin: {expected.replace('{file}', str(blocker))}\n"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# --- issue 49 item 6: the algorithm template's step program and its conformance test --------


def test_the_algorithm_template_has_a_step_program_its_test_and_key_fields(tmp_path, capsys):
    assert main(["new-plugin", "algorithm", "stepped", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    root = tmp_path / "stepped"
    source = (root / "src" / "stepped" / "algorithm.py").read_text()
    assert "def step_program(self)" in source
    assert "attrs.field(" not in source  # every key declared with key(default, "help")
    assert source.count(" = key(") == 4
    test = (root / "tests" / "test_stepped.py").read_text()
    assert "check_step_program(" in test
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]
