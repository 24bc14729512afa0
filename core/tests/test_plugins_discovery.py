"""Plugin discovery through the committed fake distributions in tests/data/fake-plugin.

Those ``*.dist-info`` folders are on pytest's ``pythonpath``, so ``importlib.metadata`` finds
them exactly as it finds a pip-installed plugin.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rlcore_fake.good
import rlcore_fake_dup

from rlcore import hookspecs
from rlcore.errors import PluginError
from rlcore.hookspecs import hookimpl
from rlcore.interfaces import BaseEngine, BaseReward
from rlcore.plugins import DISABLED_KEY, KINDS, PluginRegistry, default_registry

REPO = Path(__file__).resolve().parents[2]
FAKE_PATH = REPO / "tests" / "data" / "fake-plugin"

BROKEN = (
    "plugin 'fake_broken' (rlcore_fake.broken) of rlcore-fake 0.1 could not be loaded: "
    "No module named 'rlcore_fake_nonexistent_dependency'"
)
TYPO = (
    "rlcore-fake 0.1: plugin 'fake_typo' implements unknown hook 'register_engine' "
    "(did you mean 'register_engines'?)"
)
DUP = "reward 'fake_dup' is provided by both rlcore-fake 0.1 and rlcore-fake-dup 0.2"


@pytest.fixture
def registry():
    return PluginRegistry()


def _fake_only() -> PluginRegistry:
    """In-process registration: independent of which real plugins the venv holds."""
    reg = PluginRegistry(entry_points=False)
    reg.register(rlcore_fake.good)
    return reg


def test_good_plugin_is_found_with_its_distribution(registry):
    (engine,) = [e for e in registry.entries("engine") if e.name == "fake"]
    assert (engine.distribution, engine.version, engine.plugin) == (
        "rlcore-fake",
        "0.1",
        "fake_good",
    )
    assert engine.target == "rlcore_fake.components:FakeEngine"
    cls = registry.resolve("engine", "fake")
    assert cls.__name__ == "FakeEngine"
    assert issubclass(cls, BaseEngine)
    assert registry.resolve("engine", "fake") is cls  # cached


def test_broken_plugin_is_reported_and_the_others_still_load(registry):
    problems = {p.plugin: p for p in registry.problems}
    broken = problems["fake_broken"]
    assert (broken.distribution, broken.version, broken.status) == ("rlcore-fake", "0.1", "error")
    assert broken.message == BROKEN
    assert broken.reason == "import error: No module named 'rlcore_fake_nonexistent_dependency'"
    # Same distribution, other entry points: unaffected.
    assert registry.resolve("reward", "fake").__name__ == "FakeReward"
    assert "fake" in registry.names("algorithm")


def test_misspelled_hook_names_the_distribution(registry):
    typo = next(p for p in registry.problems if p.plugin == "fake_typo")
    assert typo.message == TYPO
    assert "fake_typo" not in registry.names("engine")


def test_duplicate_name_fails_only_that_name(registry):
    assert registry.is_duplicate("reward", "fake_dup")
    assert "fake_dup" not in registry.names("reward")
    assert [p.message for p in registry.problems if p.status == "duplicate"] == [DUP]
    with pytest.raises(PluginError) as exc:
        registry.resolve("reward", "fake_dup")
    assert str(exc.value) == DUP
    assert registry.resolve("reward", "fake_exact").__name__ == "FakeExactReward"


def test_strict_mode_raises_on_the_first_broken_plugin():
    with pytest.raises(PluginError) as exc:
        PluginRegistry(strict=True)
    assert str(exc.value) == BROKEN
    assert isinstance(exc.value.__cause__, ImportError)
    # With the broken one disabled, strict mode reaches the misspelled hook.
    with pytest.raises(PluginError, match="unknown hook 'register_engine'"):
        PluginRegistry(strict=True, disabled=["fake_broken"])


@pytest.mark.parametrize("value", ["rlcore-fake", "rlcore_fake", "*"])
def test_disabled_plugins(value):
    reg = PluginRegistry(disabled=["unrelated", f" {value}"])
    assert "fake" not in reg.names("engine")
    disabled = {p.plugin: p for p in reg.problems if p.status == "disabled"}
    assert set(disabled) >= {"fake_good", "fake_broken", "fake_typo"}
    assert disabled["fake_good"].message == (
        f"rlcore-fake 0.1: plugin 'fake_good' disabled by {DISABLED_KEY}"
    )
    assert not [p for p in reg.problems if p.distribution == "rlcore-fake" and p.status == "error"]


def test_disable_one_entry_point():
    reg = default_registry(["fake_broken", "fake_typo"])
    assert "fake" in reg.names("engine")
    fake = {p.plugin: p.status for p in reg.problems if p.distribution == "rlcore-fake"}
    assert fake == {"fake_broken": "disabled", "fake_typo": "disabled"}


def test_unknown_name_lists_installed_and_suggests():
    reg = _fake_only()
    with pytest.raises(PluginError) as exc:
        reg.resolve("engine", "fkae", where="[actor.engine] of run.toml")
    assert str(exc.value) == (
        "unknown engine 'fkae' in [actor.engine] of run.toml. Installed: fake. Did you mean 'fake'?"
    )


def test_typo_of_a_first_party_name_suggests_how_to_install():
    reg = _fake_only()
    with pytest.raises(PluginError) as exc:
        reg.resolve("engine", "fdsp2")
    assert str(exc.value) == (
        "unknown engine 'fdsp2'. Installed: fake. Did you mean 'fsdp2'? (pip install rlcore-fsdp2)"
    )


def test_first_party_name_not_installed():
    reg = _fake_only()
    with pytest.raises(PluginError) as exc:
        reg.resolve("rollout", "vllm", where="[rollout] of run.toml")
    assert str(exc.value) == (
        "rollout 'vllm' in [rollout] of run.toml is not installed. "
        "Install it with: pip install rlcore-vllm"
    )


def test_import_failure_of_the_selected_class(registry):
    with pytest.raises(PluginError) as exc:
        registry.resolve("rollout", "fake_missing")
    assert str(exc.value) == (
        "rollout 'fake_missing' (rlcore_fake.needs_missing:MissingRollout) could not be "
        "imported: No module named 'rlcore_fake_missing_backend'. "
        "rlcore-fake is installed but needs 'rlcore_fake_missing_backend': install the "
        "package that provides it"
    )


def test_check_resolves_targets_without_importing_them(registry):
    import sys

    entries = {(e.kind, e.name): e for e in registry.entries()}
    assert registry.check(entries[("rollout", "fake_missing")]) == (
        "import error: No module named 'rlcore_fake_missing_backend'"
    )
    assert "rlcore_fake.needs_missing" not in sys.modules  # found by reading, not importing
    assert registry.check(entries[("engine", "fake")]) == "ok"

    class Ghosts:
        @hookimpl
        def register_engines(self):
            return {
                "ghost": "rlcore_fake.components:GhostEngine",
                "nomodule": "rlcore_fake_nowhere:Engine",
            }

    registry.register(Ghosts(), name="ghosts")
    entries = {e.name: e for e in registry.entries("engine")}
    assert registry.check(entries["ghost"]) == (
        "class missing: 'rlcore_fake.components' defines no 'GhostEngine'"
    )
    assert registry.check(entries["nomodule"]) == (
        "import error: No module named 'rlcore_fake_nowhere'"
    )


def test_wrong_base_class(registry):
    with pytest.raises(PluginError) as exc:
        registry.resolve("rollout", "fake_notsub")
    assert str(exc.value) == (
        "rollout 'fake_notsub' (rlcore_fake.components:NotARollout) from rlcore-fake 0.1 "
        "is not a subclass of rlcore.interfaces.BaseRollout"
    )


def test_unknown_kind():
    with pytest.raises(PluginError, match="unknown plugin kind 'engines'"):
        _fake_only().resolve("engines", "fake")


def test_in_process_plugin_with_class_targets_and_duplicates():
    from rlcore_fake.components import FakeReward

    class Local:
        @staticmethod
        @hookimpl
        def register_rewards():
            return {"local": FakeReward}

    reg = PluginRegistry(entry_points=False)
    reg.register(Local(), name="local-plugin")
    reg.register(rlcore_fake.good)
    reg.register(rlcore_fake_dup)
    assert reg.resolve("reward", "local") is FakeReward
    assert issubclass(reg.resolve("reward", "local"), BaseReward)
    assert reg.problems[0].message == (
        "reward 'fake_dup' is provided by both plugin 'rlcore_fake.good' and "
        "plugin 'rlcore_fake_dup'"
    )


def test_bad_hook_results_are_reported():
    class Bad:
        @staticmethod
        @hookimpl
        def register_engines():
            return {"nocolon": "module_without_class", "ok": "m:C"}

        @staticmethod
        @hookimpl
        def register_rollouts():
            raise RuntimeError("boom")

    reg = PluginRegistry(entry_points=False)
    reg.register(Bad(), name="bad")
    reasons = sorted(p.reason for p in reg.problems)
    assert reasons == [
        "bad registration 'nocolon' -> 'module_without_class'",
        "register_rollouts() failed: RuntimeError: boom",
    ]
    assert reg.names("engine") == ["ok"]


def test_default_registry_is_shared_and_finds_the_fake():
    assert default_registry() is default_registry()
    assert default_registry().resolve("engine", "fake").__name__ == "FakeEngine"


def test_every_hookspec_is_documented_and_maps_to_a_kind():
    specs = [
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, "rlcore_spec")
    ]
    # One hook per kind, the kind's plural (policy_loss -> register_policy_losses).
    plural = {k: f"{k}es" if k.endswith("s") else f"{k}s" for k in KINDS}
    assert sorted(specs) == sorted(f"register_{plural[k]}" for k in KINDS)
    for name in specs:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Example::" in doc, name


def test_discovery_imports_no_heavy_framework():
    code = (
        "import sys, rlcore, rlcore.plugins, rlcore.config, rlcore.cli\n"
        "r = rlcore.plugins.default_registry()\n"
        "assert r.entries('engine'), 'no engine found'\n"
        "assert 'fake' in r.names('engine')\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'ray', 'vllm', 'sglang') "
        "if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(FAKE_PATH)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
