"""Bad-input catalogue, phase 1: the config file and its overrides (``rlcore config validate``).

Each case: one exact line on stderr, exit code 2, no traceback (see ``_bad_inputs.py``).
"""

from __future__ import annotations

import _bad_inputs as bi
import pytest

from rlcore.cli import main
from rlcore.config import load_config
from rlcore.preflight import preflight

registry, registry_without_backends, tiny, run = (
    bi.registry,
    bi.registry_without_backends,
    bi.tiny,
    bi.run,
)


def test_the_base_run_is_valid(run, capsys, registry):
    assert bi.cli(["config", "validate", str(run)], capsys, registry) == (0, "")
    checked = preflight(load_config(run, registry=registry), registry=registry)
    assert (len(checked.train_set), len(checked.val_set)) == (8, 2)
    assert checked.tokenizer.chat_template


# --- configuration -----------------------------------------------------------------------------

# (overrides, message after "<config>: ")
CONFIG_CASES = [
    (["trainr.seed=1"], "trainr: unknown section (did you mean 'trainer'?)"),
    (
        ["actor.optim.learning_rate=1e-5"],
        "actor.optim.learning_rate: unknown key (did you mean 'lr'?)",
    ),
    (["rollout.temprature=0.5"], "rollout.temprature: unknown key (did you mean 'temperature'?)"),
    (['data.train_batch_size="8"'], 'data.train_batch_size: expected an integer, got "8"'),
    (["actor.optim.lr=-1"], "actor.optim.lr: must be > 0.0, got -1.0"),
    (["rollout.top_p=1.5"], "rollout.top_p: must be <= 1.0, got 1.5"),
    (
        ['model.dtype="fp8"'],
        'model.dtype: must be one of "float32", "bfloat16", "float16"; got "fp8"',
    ),
    (['resources.device="tpu"'], 'resources.device: must be one of "cpu", "cuda"; got "tpu"'),
    (
        ['trainer.loggers=["nosuch"]'],
        "trainer.loggers[0]: unknown logger 'nosuch'. "
        "Installed: console, jsonl, mlflow, tensorboard, wandb.",
    ),
    (["data.train_files=[]"], "data.train_files: must not be empty"),
    (
        ["actor.engine.name=fdsp2"],
        "actor.engine.name: unknown engine 'fdsp2'. Installed: fsdp2, megatron, torch. "
        "Did you mean 'fsdp2'?",
    ),
    (
        ["algorithm.name=grp"],
        "algorithm.name: unknown algorithm 'grp'. "
        "Installed: best_of_n, dapo, distill, grpo, ppo, reinforce_plus_plus, remax, rloo. "
        "Did you mean 'grpo'?",
    ),
    (
        ['reward.default="gsm9k"'],
        "reward.default: unknown reward 'gsm9k'. Installed: code, gsm8k, gsm8k_tool, judge, math. "
        "Did you mean 'gsm8k'?",
    ),
    (
        ["actor.engine.reshard_after_foward=false"],
        "actor.engine.reshard_after_foward: unknown key (did you mean 'reshard_after_forward'?)",
    ),
    (["algorithm.epsilon=0"], "algorithm.epsilon: must be > 0.0, got 0.0"),
    (
        ["algorithm.name=remax", 'algorithm.adv_estimator="grpo"'],
        'algorithm.adv_estimator: must be one of "remax"; got "grpo"',
    ),
    (
        ["actor.max_tokens_per_micro_batch=4096"],
        "actor.max_tokens_per_micro_batch: set micro_batch_size or "
        "max_tokens_per_micro_batch, not both",
    ),
    (
        ["trainer.total_steps=10", "trainer.total_epochs=2"],
        "trainer.total_steps: set total_steps or total_epochs, not both",
    ),
    (
        ["reward.weights.math=1.0"],
        "reward.weights.math: reward 'math' is not selected by reward.default or reward.sources",
    ),
    # issue 27: batched scorers share the reward names, keys and checks
    (
        ['reward.default=["gsm8k", "my_batched"]'],
        "reward.default: unknown reward 'my_batched'. "
        "Installed: code, gsm8k, gsm8k_tool, judge, math.",
    ),
    (
        ['reward.default=["gsm8k"]', "reward.weights.my_batched=0.5"],
        "reward.weights.my_batched: reward 'my_batched' is not selected by reward.default or "
        "reward.sources",
    ),
    (
        ["reward.batch_timeout_s=0"],
        "reward.batch_timeout_s: must be a finite number > 0 and <= 9223372036 s "
        "(a thread's join), got 0.0",
    ),
    (["actor.optim"], "override 'actor.optim': expected KEY=VALUE, e.g. actor.optim.lr=1e-5"),
    (["actor..lr=1"], "override 'actor..lr=1': 'actor..lr' is not a valid key path"),
    (["model.path.x=1"], "override 'model.path.x=1': model.path is not a table"),
    # issue 31: table headers smuggled into an override's key or value
    (
        ["[actor]\n[critic]\nppo_epochs=2"],
        "override '[actor]\\n[critic]\\nppo_epochs=2': '[actor]\\n[critic]\\nppo_epochs' is "
        "not a valid key path",
    ),
    (
        ["[trainer]\nseed=1"],
        "override '[trainer]\\nseed=1': '[trainer]\\nseed' is not a valid key path",
    ),
    (
        ["trainer.seed=1\n[actor]\nppo_epochs = 9"],
        "override 'trainer.seed=1\\n[actor]\\nppo_epochs = 9': the value is more than one "
        "TOML value (a newline and another key or table header); give one value, e.g. a "
        "number, string or [array]",
    ),
    # issue 15: TOML's inf and nan are refused where a number is expected
    (
        ["resources.cpus_per_process=inf"],
        "resources.cpus_per_process: expected a finite number, got inf",
    ),
    (
        ["resources.cpus_per_process=nan"],
        "resources.cpus_per_process: expected a finite number, got nan",
    ),
    (["actor.optim.lr=-inf"], "actor.optim.lr: expected a finite number, got -inf"),
    # issue 15: the divergence guard's gradient-norm ceiling is a validated key
    (["trainer.grad_norm_ceiling=0"], "trainer.grad_norm_ceiling: must be > 0.0, got 0.0"),
    (
        ["trainer.grad_norm_ceiling=inf"],
        "trainer.grad_norm_ceiling: expected a finite number, got inf",
    ),
    (
        [f"trainer.x={'[' * 1000}{']' * 1000}"],
        "invalid TOML in override 'trainer.x': arrays or inline tables nested too deeply to "
        "read (hundreds of levels); a config needs a few",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "message"), CONFIG_CASES, ids=[c[0][0][:40] for c in CONFIG_CASES]
)
def test_config_error(run, capsys, registry, overrides, message):
    code, err = bi.cli(["config", "validate", str(run), *overrides], capsys, registry)
    bi.assert_one_line(code, err, f"{run}: {message}")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor.engine.name=megatron"],
            "actor.engine.name: engine 'megatron' is not installed. "
            "Install it with: pip install rlcore-megatron",
        ),
        (
            ["rollout.name=vllm"],
            "rollout.name: rollout 'vllm' is not installed. "
            "Install it with: pip install rlcore-vllm",
        ),
        (
            ["algorithm.name=remax"],
            "algorithm.name: algorithm 'remax' is not installed. "
            "Install it with: pip install rlcore-remax",
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_first_party_plugin_not_installed(
    run, capsys, registry_without_backends, overrides, message
):
    code, err = bi.cli(
        ["config", "validate", str(run), *overrides], capsys, registry_without_backends
    )
    bi.assert_one_line(code, err, f"{run}: {message}")


def test_missing_config_file(tmp_path, capsys, registry):
    code, err = bi.cli(["config", "validate", str(tmp_path / "nope.toml")], capsys, registry)
    bi.assert_one_line(code, err, f"config file '{tmp_path / 'nope.toml'}' not found")


def test_toml_syntax_error(tmp_path, capsys, registry):
    bad = tmp_path / "bad.toml"
    bad.write_text('[data]\ntrain_files = "a.jsonl\n')
    code, err = bi.cli(["config", "validate", str(bad)], capsys, registry)
    bi.assert_one_line(
        code, err, f"invalid TOML in {bad} at line 2, column 23: Illegal character '\\n'"
    )


def test_missing_required_section(tmp_path, capsys, registry):
    bad = tmp_path / "nomodel.toml"
    bad.write_text('[data]\ntrain_files = "a.jsonl"\n[reward]\ndefault = "gsm8k"\n')
    code, err = bi.cli(["config", "validate", str(bad)], capsys, registry)
    bi.assert_one_line(code, err, f"{bad}: model.path: missing required key")


def test_debug_shows_the_traceback(run, capsys, registry_without_backends):
    argv = ["--debug", "config", "validate", str(run), "rollout.name=vllm"]
    assert main(argv, registry=registry_without_backends) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.endswith("Install it with: pip install rlcore-vllm\n")


# --- the config file itself (issue 15): binary, Latin-1, nested past tomllib's recursion ------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\x00\x01\xff\xfe\x89PNG\r\n", "invalid start byte at byte 2"),
        ('[model]\npath = "caf\u00e9"\n'.encode("latin-1"), "invalid continuation byte at byte 19"),
    ],
    ids=["binary", "latin-1"],
)
def test_config_file_not_utf8(tmp_path, capsys, registry, content, reason):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(content)
    for command in (["config", "validate"], ["train"]):
        code, err = bi.cli([*command, str(bad)], capsys, registry)
        bi.assert_one_line(
            code, err, f"config file '{bad}' is not UTF-8 text ({reason}); save it as UTF-8"
        )


def test_config_nested_100000_arrays_deep(tmp_path, capsys, registry):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    for command in (["config", "validate"], ["train"]):
        code, err = bi.cli([*command, str(deep)], capsys, registry)
        bi.assert_one_line(
            code,
            err,
            f"invalid TOML in {deep}: arrays or inline tables nested too deeply to read "
            "(hundreds of levels); a config needs a few",
        )


# --- overrides (issue 15): an inline table merges into the table it names --------------------


def test_an_inline_table_override_keeps_the_other_keys(run, capsys, registry):
    """``actor.optim={warmup_steps=1}`` used to replace the table: ``lr`` silently dropped to
    its default. Now it merges, as ``rlcore config show`` (the resolved config) proves."""
    import tomllib

    run.write_text(run.read_text() + "\n[actor.optim]\nlr = 3e-6\n")
    assert (
        main(["config", "show", str(run), "actor.optim={warmup_steps=1}"], registry=registry) == 0
    )
    shown = tomllib.loads(capsys.readouterr().out)
    assert (shown["actor"]["optim"]["lr"], shown["actor"]["optim"]["warmup_steps"]) == (3e-6, 1)
    assert shown["actor"]["ppo_mini_batch_size"] == 2  # [actor] itself untouched


@pytest.mark.parametrize("engine", ["megatron", "torch"])
def test_compile_on_an_engine_without_a_compiled_update(run, capsys, registry, engine):
    bi.case(
        run,
        capsys,
        registry,
        [f'actor.engine.name="{engine}"', "actor.compile=true"],
        f"actor.compile = true: engine '{engine}' has no compiled update; set "
        "actor.compile = false (the fsdp2 engine has one)",
    )
