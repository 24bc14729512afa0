"""``rlcore config from-verl`` on verl's own configs, as verl's users run them.

tests/data/verl/ holds, unedited below a header naming their source, files of verl v0.7.0
(github.com/volcengine/verl, commit f9c855f7cf04d603c9546bc01776c74806a879c1):
``verl/trainer/config/_generated_ppo_trainer.yaml`` (verl's whole default config) and three
launch scripts whose Hydra overrides go on top of it: ``examples/grpo_trainer/run_qwen2-7b.sh``
(GSM8K GRPO), ``examples/grpo_trainer/run_qwen2-7b_math.sh`` (GSM8K + MATH GRPO) and
``recipe/dapo/test_dapo_7b_math.sh`` (DAPO); and ``verl/trainer/config/actor/actor.yaml``, whose
``lr: 1e-6`` YAML 1.1 reads as text. The scripts run in bash with ``python3`` stubbed
to print its arguments, so the overrides are exactly what their shell would pass; their data
and model paths point at a tiny model and small parquet files (through ``$HOME`` and the
scripts' own variables). Each converts, validates without edits, and the DAPO one trains a
step. The rest are the bad inputs of issue 50 (hostile YAML, interpolation, values, ``-o``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.config import load_config

VERL = Path(__file__).resolve().parent / "data" / "verl"
YAML = VERL / "_generated_ppo_trainer.yaml"
SCRIPTS = ("run_qwen2-7b.sh", "run_qwen2-7b_math.sh", "test_dapo_7b_math.sh")


def script_overrides(script: str, env: dict[str, str]) -> list[str]:
    """The Hydra overrides ``script`` passes to ``python3 -m verl.trainer.main_ppo``."""
    stub = 'python3() { printf "%s\\0" "$@"; }; source "$0"'
    out = subprocess.run(
        ["bash", "-c", stub, str(VERL / script)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    args = out.split("\0")[:-1]
    assert args[:2] == ["-m", "verl.trainer.main_ppo"], args[:3]
    return args[2:]


@pytest.fixture(scope="module")
def verl_home(tmp_path_factory):
    """$HOME with the files verl's examples read, a model folder, the DAPO script's paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlcore.testing.runs import arithmetic_rows

    home = tmp_path_factory.mktemp("verl_home")
    model = home / "model"  # converting needs a path; the step test builds a real model
    model.mkdir()

    def parquet(path: Path, source: str, split: str) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = arithmetic_rows([(a, b) for a in range(3) for b in range(3)], split, source)
        pq.write_table(pa.Table.from_pylist(rows), path)
        return str(path)

    for name, source in (("gsm8k", "openai/gsm8k"), ("math", "lighteval/MATH")):
        for split in ("train", "test"):
            parquet(home / "data" / name / f"{split}.parquet", source, split)
    env = {
        "HOME": str(home),
        "MODEL_PATH": str(model),
        "TRAIN_FILE": parquet(home / "dapo" / "dapo-math-17k.parquet", "math_dapo", "train"),
        "TEST_FILE": parquet(home / "dapo" / "aime-2024.parquet", "aime", "test"),
        "CKPTS_DIR": str(home / "ckpts" / "DAPO"),
    }
    return home, model, env


def _with_model(overrides: list[str], model: Path) -> list[str]:
    # The GRPO examples name a Hub model; the test swaps in the tiny one (the DAPO script
    # takes MODEL_PATH from the environment).
    key = "actor_rollout_ref.model.path="
    return [f"{key}{model}" if o.startswith(key) else o for o in overrides]


def _convert(tmp_path: Path, *args: str) -> tuple[int, Path, list[str]]:
    import io
    from contextlib import redirect_stderr

    out = tmp_path / "run.toml"
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["config", "from-verl", *args, "-o", str(out)])
    return rc, out, err.getvalue().splitlines()


def test_the_scripts_pass_the_overrides_their_shell_would(verl_home):
    _, _, env = verl_home
    gsm8k = script_overrides("run_qwen2-7b.sh", env)
    assert "algorithm.adv_estimator=grpo" in gsm8k
    assert 'trainer.logger=["console","wandb"]' in gsm8k
    assert len(gsm8k) == 37
    dapo = script_overrides("test_dapo_7b_math.sh", env)
    assert f"actor_rollout_ref.model.path={env['MODEL_PATH']}" in dapo
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480" in dapo


def test_verls_whole_default_config_converts_and_validates(tmp_path):
    rc, out, err = _convert(tmp_path, str(YAML))
    assert rc == 0
    cfg = load_config(out)
    assert "${" not in out.read_text()  # every interpolation resolved or listed
    assert (cfg.algorithm.name, cfg.algorithm.options.adv_estimator) == ("ppo", "gae")
    assert cfg.actor.optim.lr == 1e-6
    assert cfg.critic.optim.lr == 1e-5
    assert cfg.trainer.run_dir == "checkpoints/verl_examples/gsm8k"  # default_local_dir
    assert cfg.trainer.loggers == ("console", "wandb", "jsonl")
    assert cfg.trainer.logger_options["wandb"].project == "verl_examples"
    assert cfg.reward.default == ("math",)
    unmapped = [line for line in err if line.startswith("not mapped: ")]
    assert err[-1] == f"{len(unmapped)} verl keys not mapped"
    assert len(unmapped) == len(set(unmapped))
    assert not any("_target_" in line for line in unmapped)
    # Each with its reason, not a bare "no rlcore key" for whole families of keys.
    assert any(
        line.startswith("not mapped: global_profiler.tool = ") and "profiler" in line
        for line in unmapped
    )
    assert any(
        line.startswith("not mapped: actor_rollout_ref.actor.fsdp_config.") and "fsdp2" in line
        for line in unmapped
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_verls_example_scripts_convert_and_validate(script, verl_home, tmp_path):
    home, model, env = verl_home
    overrides = _with_model(script_overrides(script, env), model)
    rc, out, err = _convert(tmp_path, str(YAML), *overrides)
    assert rc == 0
    cfg = load_config(out)  # validates every section and plugin key, without edits
    assert cfg.model.path == str(model)
    assert cfg.actor.optim.lr == 1e-6
    assert isinstance(cfg.actor.optim.lr, float)
    # verl's DAPO example is GRPO with the dapo reward manager: rlcore's dapo algorithm
    assert cfg.algorithm.name == ("dapo" if "dapo" in script else "grpo")
    assert "${" not in out.read_text()
    assert cfg.reward.default == ("math",)
    assert any(line.startswith('note: reward.default = ["math"]') for line in err)
    if script == "run_qwen2-7b_math.sh":
        assert cfg.data.train_files == (
            str(home / "data/gsm8k/train.parquet"),
            str(home / "data/math/train.parquet"),
        )
        assert cfg.reward.sources["lighteval/MATH"] == ("math",)
        assert (
            cfg.trainer.run_dir == "checkpoints/verl_grpo_example_gsm8k_math/qwen2_7b_function_rm"
        )
    if script == "test_dapo_7b_math.sh":
        assert cfg.trainer.run_dir == env["CKPTS_DIR"]
        assert cfg.trainer.experiment_name == "DAPO-Qwen2.5-7b-MATH-0527a1"
        assert cfg.trainer.logger_options["wandb"].project == "DAPO"
        assert cfg.trainer.total_steps == 200
        assert cfg.actor.max_tokens_per_micro_batch == 20480
        assert (cfg.algorithm.options.clip_ratio_low, cfg.algorithm.options.clip_ratio_high) == (
            0.2,
            0.28,
        )
        assert cfg.actor.optim.weight_decay == 0.1
        assert cfg.trainer.resume == "auto"
        dapo = cfg.algorithm.options
        assert (dapo.overlong_buffer.enable, dapo.overlong_buffer.len) == (True, 4096)
        assert dapo.overlong_buffer.penalty_factor == 1.0
        assert dapo.filter_groups.enable is False  # main_ppo has no dynamic sampling


def test_the_gsm8k_example_maps_key_by_key(verl_home, tmp_path):
    home, model, env = verl_home
    overrides = _with_model(script_overrides("run_qwen2-7b.sh", env), model)
    rc, out, err = _convert(tmp_path, str(YAML), *overrides)
    assert rc == 0
    cfg = load_config(out)
    assert cfg.data.train_files == (str(home / "data/gsm8k/train.parquet"),)
    assert cfg.data.val_files == (str(home / "data/gsm8k/test.parquet"),)
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (1024, 512)
    assert (cfg.data.filter_overlong_prompts, cfg.data.truncation) == (True, "error")
    assert (cfg.actor.ppo_mini_batch_size, cfg.actor.micro_batch_size) == (256, 40)
    assert cfg.actor.gradient_checkpointing is True
    assert cfg.actor.engine.name == "fsdp2"
    assert cfg.actor.engine.options.use_remove_padding is True
    assert cfg.actor.engine.options.offload_params is False
    assert cfg.ref.micro_batch_size == 40
    assert cfg.ref.engine.options.offload_params is True  # the example offloads the reference
    assert cfg.ref.engine.options.use_remove_padding is True  # and keeps the actor's options
    assert (cfg.rollout.name, cfg.rollout.n) == ("vllm", 5)
    assert cfg.rollout.options.gpu_memory_utilization == 0.6
    assert cfg.rollout.options.tensor_parallel_size == 2
    algo = cfg.algorithm.options
    assert (cfg.algorithm.name, algo.adv_estimator) == ("grpo", "grpo")
    assert (algo.use_kl_loss, algo.kl_loss_coef, algo.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert (algo.entropy_coeff, algo.use_kl_in_reward) == (0.0, False)
    assert cfg.trainer.total_epochs == 15
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == (20, 5)
    assert cfg.trainer.experiment_name == "qwen2_7b_function_rm"
    assert cfg.trainer.run_dir == "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_function_rm"
    assert cfg.trainer.loggers == ("console", "wandb", "jsonl")
    assert cfg.trainer.logger_options["wandb"].project == "verl_grpo_example_gsm8k"
    assert (cfg.resources.nnodes, cfg.resources.processes_per_node) == (1, 8)
    assert cfg.resources.device == "cuda"
    assert cfg.reward.sources["openai/gsm8k"] == ("gsm8k",)
    unmapped = [line for line in err if line.startswith("not mapped: ")]
    assert f"wrote {tmp_path / 'run.toml'}" in err
    assert (
        "not mapped: trainer.critic_warmup = 0 (rlcore trains the actor from the first step)"
        in unmapped
    )
    # PPO-only options, not options of the GRPO algorithm: named with where they would go.
    assert (
        "not mapped: algorithm.gamma = 1.0 (-> algorithm.gamma, which the selected plugin lacks)"
        in unmapped
    )


def test_gae_selects_ppo_with_its_options(verl_home, tmp_path):
    _, model, env = verl_home
    overrides = _with_model(script_overrides("run_qwen2-7b.sh", env), model)
    overrides = [o for o in overrides if not o.startswith("algorithm.adv_estimator=")]
    args = [*overrides, "algorithm.adv_estimator=gae", "critic.cliprange_value=0.3"]
    rc, out, err = _convert(tmp_path, str(YAML), *args)
    assert rc == 0
    cfg = load_config(out)
    assert (cfg.algorithm.name, cfg.algorithm.options.adv_estimator) == ("ppo", "gae")
    assert (cfg.algorithm.options.gamma, cfg.algorithm.options.lam) == (1.0, 1.0)
    assert cfg.algorithm.options.cliprange_value == 0.3
    assert cfg.critic.model_path == cfg.model.path
    assert not any("algorithm.gamma" in line for line in err)


# Overrides a user adds to try a verl config on a laptop: one CPU process, the HF rollout,
# a batch of 4 prompts × 2 samples, one step, console and jsonl only (no W&B login in tests).
TINY = [
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.device=cpu",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=2",
    "data.train_batch_size=4",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    'trainer.logger=["console"]',
]


# The four real verl configs: its whole default (PPO with GAE and a critic) and the three
# scripts over it. Each trains a step; by default only DAPO's runs here. Measured on an idle
# 2-core machine, one after another: dapo 14.3 s, grpo-gsm8k 9.6 s, ppo-default 9.3 s,
# grpo-gsm8k-math 8.3 s (dapo first, with the module's fixtures); alone and interleaved, dapo
# 16.7 / 14.7 s against grpo-gsm8k-math 16.4 / 14.0 s: a tie, and DAPO's maps the most (token
# budgets, clip-higher, warm-up, offload, data_source math_dapo). All four:
#   RLCORE_VERL_ALL_STEPS=1 pytest -q -m slow tests/test_config_from_verl.py -k trains_a_step
_ALL_STEPS = os.environ.get("RLCORE_VERL_ALL_STEPS") == "1"
_ONLY_WITH_ALL = pytest.mark.skipif(
    not _ALL_STEPS, reason="set RLCORE_VERL_ALL_STEPS=1 to train a step on every verl config"
)
STEP_CONFIGS = [
    pytest.param("test_dapo_7b_math.sh", id="dapo"),
    pytest.param("run_qwen2-7b.sh", id="grpo-gsm8k", marks=_ONLY_WITH_ALL),
    pytest.param("run_qwen2-7b_math.sh", id="grpo-gsm8k-math", marks=_ONLY_WITH_ALL),
    pytest.param(None, id="ppo-default", marks=_ONLY_WITH_ALL),
]


@pytest.mark.slow
@pytest.mark.parametrize("script", STEP_CONFIGS)
def test_a_verl_config_trains_a_step(script, ray_session, verl_home, tmp_path):
    from rlcore.testing.runs import tiny_run_model
    from rlcore.trainer import run_training

    _, _, env = verl_home
    model = tiny_run_model(tmp_path / "model")
    env = {**env, "MODEL_PATH": str(model)}
    # The default config alone: verl's own defaults (GSM8K under $HOME, a Hub model to swap).
    overrides = [] if script is None else script_overrides(script, env)
    overrides = _with_model(overrides, model)
    if script is None:  # its ~/data/rlhf/gsm8k and Hub model, swapped like the scripts' paths
        home = verl_home[0]
        overrides += [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={home / 'data/gsm8k/train.parquet'}",
            f"data.val_files={home / 'data/gsm8k/test.parquet'}",
        ]
    run_dir = tmp_path / "run"
    # The overlong buffer (4,096 tokens, DAPO) shrinks with the response budget (8 tokens).
    buffer = (
        ["reward_model.reward_kwargs.overlong_buffer_cfg.len=4"]
        if script and "dapo" in script
        else []
    )
    args = [*overrides, *TINY, *buffer, f"trainer.default_local_dir={run_dir}"]
    if script is None:  # the critic's batch sizes follow the actor's in the tiny run
        args += ["critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=8"]
    rc, out, _ = _convert(tmp_path, str(YAML), *args)
    assert rc == 0
    cfg = load_config(out)
    assert run_training(cfg) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert rows[0]["actor/nonfinite"] == 0.0
    if script and "dapo" in script:
        assert "dapo/overlong_frac" in rows[0]  # trained by rlcore's dapo, its overlong buffer on
    if script is None:
        assert "critic/vf_loss" in rows[0]  # verl's default: PPO with a critic


def test_docs_porting_from_verl_lists_every_mapping_and_reason():
    from rlcore.config.from_verl import MAPPING
    from rlcore.config.verl_reasons import WHY_NOT

    doc = (Path(__file__).resolve().parents[1] / "docs" / "porting-from-verl.md").read_text()
    rows = {line for line in doc.splitlines() if line.startswith("| `")}
    missing = [
        verl
        for verl, (target, _) in MAPPING.items()
        if not any(row.startswith(f"| `{verl}` | `{target}` |") for row in rows)
    ]
    missing += [p for p, why in WHY_NOT if f"| `{p}` | {why} |" not in rows]
    assert not missing, f"docs/porting-from-verl.md lacks: {missing}"


# --- numbers, rewards, run folder, loggers (issue 49) -----------------------------------------


# The two keys rlcore requires, for the small hand-written configs below.
BASE = ("data.train_files=train.parquet", "actor_rollout_ref.model.path=model")


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "verl.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_an_exponent_without_a_dot_stays_a_number(tmp_path):
    # YAML 1.1 reads 1e-4 as text; OmegaConf (verl's loader) as a float.
    path = _yaml(tmp_path, "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-4\n")
    rc, out, _ = _convert(tmp_path, str(path), *BASE, "critic.optim.lr=3e-5")
    assert rc == 0
    cfg = load_config(out)
    assert cfg.actor.optim.lr == 1e-4
    assert isinstance(cfg.actor.optim.lr, float)


def test_use_torch_compile_maps_only_from_the_command_line(tmp_path):
    """verl's YAML default (true) leaves actor.compile off; an override turns it on."""
    path = _yaml(tmp_path, "actor_rollout_ref:\n  actor:\n    use_torch_compile: true\n")
    rc, out, _ = _convert(tmp_path, str(path), *BASE)
    assert rc == 0
    assert load_config(out).actor.compile is False
    override = "actor_rollout_ref.actor.use_torch_compile=true"
    rc, out, _ = _convert(tmp_path, str(path), *BASE, override)
    assert rc == 0
    assert load_config(out).actor.compile is True


def test_verls_actor_yaml_learning_rate_is_a_float(tmp_path):
    # verl's own actor.yaml (v0.7.0, tests/data/verl/actor.yaml) writes `lr: 1e-6`.
    import yaml

    from rlcore.config.from_verl import convert
    from rlcore.config.verl_yaml import read_yaml_file

    actor_yaml = VERL / "actor.yaml"
    assert yaml.safe_load(actor_yaml.read_text())["optim"]["lr"] == "1e-6"  # YAML 1.1: text
    actor = read_yaml_file(actor_yaml)
    conversion = convert({"actor_rollout_ref": {"actor": actor}}, BASE)
    out = tmp_path / "run.toml"
    out.write_text(conversion.toml)
    lr = load_config(out).actor.optim.lr
    assert lr == 1e-6
    assert isinstance(lr, float)


def test_a_number_written_as_text_is_coerced_with_a_line(tmp_path):
    path = _yaml(tmp_path, 'actor_rollout_ref:\n  actor:\n    optim:\n      lr: "1e-4"\n')
    rc, out, err = _convert(tmp_path, str(path), *BASE)
    assert rc == 0
    assert load_config(out).actor.optim.lr == 1e-4
    assert (
        "note: verl's actor_rollout_ref.actor.optim.lr (-> actor.optim.lr): "
        "text '1e-4' written as the float 0.0001" in err
    )


def test_a_custom_data_source_gets_the_default_reward_written_and_printed(tmp_path):
    path = _yaml(tmp_path, "data:\n  reward_fn_key: data_source\n")
    rc, out, err = _convert(tmp_path, str(path), *BASE)
    assert rc == 0
    assert load_config(out).reward.default == ("math",)
    assert '# reward.default = ["math"]: rows whose data_source' in out.read_text()
    assert any("add your data_source to reward.sources" in line for line in err)


def test_run_folder_project_and_loggers_carry_over(tmp_path):
    path = _yaml(
        tmp_path,
        """
        trainer:
          project_name: proj
          experiment_name: exp
          default_local_dir: /tmp/ckpt/${trainer.project_name}/${trainer.experiment_name}
          logger: [console, file, mlflow, swanlab]
        """,
    )
    rc, out, err = _convert(tmp_path, str(path), *BASE)
    assert rc == 0
    cfg = load_config(out)
    assert cfg.trainer.run_dir == "/tmp/ckpt/proj/exp"
    assert cfg.trainer.experiment_name == "exp"
    assert cfg.trainer.loggers == ("console", "jsonl", "mlflow")  # verl's "file" is JSON lines
    assert cfg.trainer.logger_options["mlflow"].experiment == "proj"  # verl: set_experiment
    assert any(line.startswith('not mapped: trainer.logger = "swanlab" (') for line in err)


# --- hostile YAML (issue 50) ------------------------------------------------------------------


def _one_line_error(err: list[str], start: str) -> None:
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {start}"), err[0]


def test_an_alias_bomb_is_one_line_under_a_1_gib_address_space(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(8):
        prev, cur = chr(97 + i), chr(98 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb.write_text("\n".join(lines) + "\n")
    # Imports first, then the limits, then the conversion: 2 s tells "refused" from "never
    # returns" (main's code did not return), with room for a loaded CI machine.
    child = textwrap.dedent(
        f"""
        import resource, signal, sys
        from rlcore.cli import main
        import rlcore.config.from_verl, yaml
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        signal.alarm(2)
        sys.exit(main(["config", "from-verl", {str(bomb)!r}]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"error: verl config '{bomb}': expands to more than 200,000 values through aliases "
        "at line 6 (an alias bomb?)"
    ]


def test_deep_nesting_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 50_000)
    assert main(["config", "from-verl", str(deep)]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(),
        f"verl config '{deep}': nested deeper than 64 levels at line 1",
    )


def test_an_oversized_file_and_a_self_alias_are_one_line_each(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (5 * 1024 * 1024) + "\n")
    assert main(["config", "from-verl", str(big)]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(), f"verl config '{big}' is larger than 4 MiB"
    )
    loop = _yaml(tmp_path, "a: &a [1, *a]\n")
    assert main(["config", "from-verl", str(loop)]) == 2
    _one_line_error(capsys.readouterr().err.splitlines(), f"verl config '{loop}': alias *a")
    digits = _yaml(tmp_path, f"data:\n  seed: 1{'0' * 5000}\n")  # past Python's int limit
    assert main(["config", "from-verl", str(digits)]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(), f"verl config '{digits}': Exceeds the limit"
    )
    twice = _yaml(tmp_path, "data:\n  seed: 1\n  seed: 2\n")
    assert main(["config", "from-verl", str(twice)]) == 2
    _one_line_error(capsys.readouterr().err.splitlines(), f"verl config '{twice}': key 'seed'")


# --- interpolation ----------------------------------------------------------------------------


def test_interpolations_resolve_as_omegaconf_and_env_ones_are_listed(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_TEST_SECRET", "hunter2")
    path = _yaml(
        tmp_path,
        """
        data:
          max_prompt_length: 100
          max_response_length: ${.max_prompt_length}
          train_batch_size: ${oc.select:data.missing,16}
          seed: ${oc.env:VERL_TEST_SECRET}
        trainer:
          experiment_name: run-${data.max_prompt_length}
        """,
    )
    rc, out, err = _convert(tmp_path, str(path), *BASE)
    assert rc == 0
    text = out.read_text()
    assert "${" not in text
    assert "hunter2" not in text
    cfg = load_config(out)
    assert (cfg.data.max_response_length, cfg.data.train_batch_size) == (100, 16)
    assert cfg.trainer.experiment_name == "run-100"
    assert any(
        line.startswith('not mapped: data.seed = "${oc.env:VERL_TEST_SECRET}" (') for line in err
    )


def test_a_missing_interpolation_key_and_a_cycle_are_one_line(tmp_path, capsys):
    path = _yaml(tmp_path, "data:\n  seed: ${nowhere.key}\n")
    assert main(["config", "from-verl", str(path)]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(),
        "data.seed = ${nowhere.key}: interpolation key 'nowhere.key' not found",
    )
    path = _yaml(tmp_path, "data:\n  seed: ${data.shuffle}\n  shuffle: ${data.seed}\n")
    assert main(["config", "from-verl", str(path)]) == 2
    _one_line_error(capsys.readouterr().err.splitlines(), "interpolation cycle: data.seed -> ")


def _doubling_text() -> str:
    lines = [f"a0: {'x' * 64}"] + [f'a{i}: "${{a{i - 1}}}${{a{i - 1}}}"' for i in range(1, 40)]
    return "\n".join(lines) + "\n"


def _doubling_tables() -> str:
    tables = ["t0:\n  x: 1\n  y: 2"]
    tables += [f"t{i}:\n  x: ${{t{i - 1}}}\n  y: ${{t{i - 1}}}" for i in range(1, 40)]
    return "\n".join(tables) + "\n"


def _chain() -> str:
    return "".join(f"k{i}: ${{k{i + 1}}}\n" for i in range(3000)) + "k3000: 1\n"


@pytest.mark.parametrize(
    ("text", "override", "start"),
    [
        (_doubling_text(), None, "a17: its interpolations expand to more than 4 MiB of text"),
        (_doubling_tables(), None, "t16.y: the config's interpolations expand to more than"),
        (_chain(), None, "k0: a chain of more than 64 interpolations"),
        ("data: {}\n", ".".join(["a"] * 5000) + "=1", "verl override 'a.a.a."),
        ("data: {}\n", "data.x=" + "[" * 5000, "override value '[[[["),
    ],
    ids=["text-doubling", "table-doubling", "chain", "deep-override-key", "deep-override-value"],
)
def test_expanding_interpolations_and_deep_overrides_are_one_line(
    text, override, start, tmp_path, capsys
):
    path = _yaml(tmp_path, text)
    assert main(["config", "from-verl", str(path), *([override] if override else [])]) == 2
    _one_line_error(capsys.readouterr().err.splitlines(), start)


# --- values the target key cannot hold --------------------------------------------------------


LR = ("actor_rollout_ref.actor.optim.lr", "actor.optim.lr")
BATCH = ("data.train_batch_size", "data.train_batch_size")
BETAS = ("actor_rollout_ref.actor.optim.betas", "actor.optim.betas")


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (LR, ".inf", "not a finite number"),
        (LR, "1e400", "not a finite number"),
        (LR, ".nan", "not a finite number"),
        (LR, "fast", "actor.optim.lr takes a float"),
        (BATCH, str(2**64), "outside the 64-bit integers"),
        (LR, "!!binary aGVsbG8=", "a YAML bytes value, which actor.optim.lr cannot hold"),
        (BETAS, "[0.9, null]", "null in a list, which TOML cannot hold"),
    ],
)
def test_a_value_the_key_cannot_hold_is_refused_naming_it(key, value, why, tmp_path, capsys):
    verl, target = key
    *tables, leaf = verl.split(".")
    text = "".join(f"{'  ' * i}{t}:\n" for i, t in enumerate(tables))
    path = _yaml(tmp_path, f"{text}{'  ' * len(tables)}{leaf}: {value}\n")
    out = tmp_path / "out.toml"
    assert main(["config", "from-verl", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    _one_line_error(err, f"verl's {verl} (-> {target}) = ")
    assert why in err[0]
    assert not out.exists()


def test_a_huge_integer_in_an_override_is_refused(tmp_path, capsys):
    path = _yaml(tmp_path, "data: {}\n")
    assert main(["config", "from-verl", str(path), f"data.train_batch_size={2**64}"]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(),
        f"verl's data.train_batch_size (-> data.train_batch_size) = {2**64}: outside",
    )


# --- output -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["same", "hardlink", "symlink"])
def test_the_input_is_never_overwritten(how, tmp_path, capsys):
    path = _yaml(tmp_path, "data:\n  seed: 1\n")
    before = path.read_text()
    out = {"same": path, "hardlink": tmp_path / "hard.toml", "symlink": tmp_path / "sym.toml"}[how]
    if how == "hardlink":
        os.link(path, out)
    elif how == "symlink":
        out.symlink_to(path)
    assert main(["config", "from-verl", str(path), "-o", str(out)]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(),
        f"-o {out} is the verl config being converted ({path})",
    )
    assert path.read_text() == before


def test_an_unwritable_output_is_one_line(tmp_path, capsys):
    path = _yaml(tmp_path, "data:\n  seed: 1\n")
    out = tmp_path / "no-such-dir" / "out.toml"
    assert main(["config", "from-verl", str(path), "-o", str(out)]) == 2
    _one_line_error(
        capsys.readouterr().err.splitlines(),
        f"cannot write -o {out}: No such file or directory",
    )


def test_a_hydra_composed_yaml_is_one_line(tmp_path, capsys):
    composed = tmp_path / "ppo_trainer.yaml"
    composed.write_text("defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n")
    assert main(["config", "from-verl", str(composed)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: verl config '{composed}' composes other files")
    assert "_generated_ppo_trainer.yaml" in err


def test_a_missing_yaml_is_one_line(tmp_path, capsys):
    assert main(["config", "from-verl", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err == f"error: verl config '{tmp_path / 'nope.yaml'}' not found\n"


def test_rollout_correction_icepop_and_rejection_masks(tmp_path):
    # verl's "lower_upper" rollout_is_threshold is IcePop's band; rollout_rs keeps its names.
    rc, out, err = _convert(
        tmp_path,
        str(YAML),
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold='0.5_2.0'",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.01",
    )
    assert rc == 0, err
    options = load_config(out).algorithm.options
    assert (options.rollout_is, options.rollout_is_threshold_lower) == ("token", 0.5)
    assert options.rollout_is_cap == 2.0
    assert (options.rollout_rs, options.rollout_rs_threshold) == ("seq_mean_k3", "0.01")
