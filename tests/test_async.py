"""``trainer.async_mode = "fully_async"``: a trajectory queue, the rollout up to
``trainer.max_staleness`` batches ahead of the trainer (rlcore.trainer.async_queue).

Real Ray, real gloo, the tiny model with the rollout on its own pool: the weight versions
every trained sample carries are read back from ``trainer.rollout_data_dir`` and checked
against the actor's version at its step; the staleness policy's row selection; and the
bad-input lines (before Ray starts).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

PLACE_ROLLOUT = """placement = { rollout = "gen" }
[resources.pools.gen]
processes_per_node = 1
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("async")
    model = tiny_run_model(root / "model")
    rows = arithmetic_rows([(a, b) for a in range(4) for b in range(4)])
    return model, write_jsonl(rows, root / "train.jsonl")


def _toml(assets, tmp_path: Path, trainer: str, **kw) -> str:
    from rlcore.testing.runs import tiny_run_toml

    model, train = assets
    text = tiny_run_toml(
        model=model, train_files=[train], run_dir=tmp_path / "run", extra=PLACE_ROLLOUT, **kw
    )
    return text.replace("[trainer]\n", f"[trainer]\n{trainer}\n", 1)


def _samples(folder: Path) -> dict[int, list[dict]]:
    return {
        int(f.stem): [json.loads(line) for line in f.read_text().splitlines()]
        for f in sorted(folder.glob("*.jsonl"))
    }


@pytest.mark.slow
def test_fully_async_keeps_every_trained_sample_within_max_staleness(ray_session, assets, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.trainer import run_training

    dump = tmp_path / "samples"
    text = _toml(
        assets,
        tmp_path,
        f'async_mode = "fully_async"\nmax_staleness = 2\nrollout_data_dir = "{dump}"',
        total_steps=4,
        lr=1e-2,
        algorithm_options='rollout_is = "token"\nentropy_coeff = 0.1',
    )
    config = load_config_text(text, source="async.toml")
    assert run_training(config) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in (json.loads(line) for line in lines) if "actor/pg_loss" in r]
    # Step 1 generates synchronously and launches steps 2 and 3 (both at version 0); step 2
    # launches step 4, which runs on the rollout after the sync of version 1.
    assert [r["rollout/weight_version"] for r in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [r["training/staleness"] for r in steps] == [0.0, 1.0, 2.0, 2.0]
    assert [r["async/queue_depth"] for r in steps] == [2.0, 2.0, 1.0, 0.0]
    assert all(r["async/stale_dropped"] == 0.0 for r in steps)
    for key in (
        "async/trainer_idle_s",
        "async/rollout_idle_s",
        "async/gen_samples_per_s",
        "async/train_samples_per_s",
        "perf/samples_per_s",
        "training/staleness_mean",
    ):
        assert all(r[key] >= 0.0 for r in steps), key
    for role in ("actor", "rollout", "driver"):  # each pool's largest process, and the driver
        assert all(0.0 < r[f"perf/peak_rss_gb/{role}"] < 64 for r in steps), role
    for phase in ("update", "generate"):  # rlcore.tracking.flops: worker compute vs the peak
        assert all(0.0 < r[f"perf/mfu/{phase}"] < 10 for r in steps), phase
        assert all(r[f"perf/model_tflops/{phase}"] > 0 for r in steps), phase
    # Every trained sample, read back: its version is within max_staleness of the actor's
    # version at its step (step s trains at version s - 1), and the prompts are the loader's
    # (4 steps x 4 prompts x n = 2, each prompt once: 16 prompts, one epoch).
    samples = _samples(dump)
    assert sorted(samples) == [1, 2, 3, 4]
    for step, rows in samples.items():
        lags = [step - 1 - r["weight_version"] for r in rows]
        assert max(lags) <= 2, (step, lags)
    indices = [r["index"] for rows in samples.values() for r in rows]
    assert sorted(indices) == sorted(list(range(16)) * 2)
    print(f"\nstaleness mean per step {[r['training/staleness_mean'] for r in steps]}")


def test_stale_rows_are_those_beyond_the_bound():
    from rlcore.protocol import DataProto
    from rlcore.trainer.async_queue import stale_rows, staleness_of

    gen = DataProto.from_dict(
        non_tensors={"weight_version": np.array([5, 4, 3, 2], dtype=np.int64)}
    )
    lag = staleness_of(gen, actor_version=5)
    assert lag.tolist() == [0, 1, 2, 3]
    assert stale_rows(lag, 2).tolist() == [False, False, False, True]
    assert not stale_rows(lag, 3).any()
    assert stale_rows(lag, 0).tolist() == [False, True, True, True]


BAD = [
    (
        ['trainer.async_mode="fully_async"', "trainer.max_staleness=-1"],
        "trainer.max_staleness: must be >= 0 (weight versions a trained sample may lag the "
        "actor by), got -1",
    ),
    (
        [
            'trainer.async_mode="fully_async"',
            'trainer.staleness_policy="reweight"',
            'algorithm.rollout_is="none"',
        ],
        "trainer.staleness_policy: 'reweight' trains stale samples relying on "
        'algorithm.rollout_is; set algorithm.rollout_is = "token" (or "sequence"), or use "drop"',
    ),
    (
        ['trainer.async_mode="fully_async"'],
        "trainer.async_mode: 'fully_async' needs the rollout on a pool of its own; set "
        'resources.placement.rollout = "NAME" and [resources.pools.NAME]',
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[c[1][:40] for c in BAD])
def test_async_config_errors(tmp_path, assets, capsys, overrides, message):
    import _bad_inputs as bi

    from rlcore.plugins import PluginRegistry

    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    config = tmp_path / "run.toml"
    text = _toml(assets, tmp_path, "")
    if len(overrides) == 1:  # the rollout colocated
        text = text.replace(PLACE_ROLLOUT, "")
    config.write_text(text)
    code, err = bi.cli(["config", "validate", str(config), *overrides], capsys, registry)
    bi.assert_one_line(code, err, f"{config}: {message}")


@pytest.mark.parametrize(
    ("trainer", "algorithm_options", "expected"),
    [
        ('async_mode = "one_step_off"', "", "token"),
        ('async_mode = "fully_async"', "", "token"),
        ('async_mode = "fully_async"', 'rollout_is = "none"', "none"),
        ('async_mode = "one_step_off"', 'rollout_is = "sequence"', "sequence"),
        ("", "", "none"),
    ],
)
def test_the_async_modes_correct_for_the_rollout_unless_told_not_to(
    assets, tmp_path, trainer, algorithm_options, expected
):
    """Left unset, ``algorithm.rollout_is`` is ``token`` in the asynchronous modes (their
    samples are older than the weights they train) and ``none`` otherwise; a value the config
    gives is kept."""
    from rlcore.config import load_config_text

    text = _toml(assets, tmp_path, trainer, algorithm_options=algorithm_options)
    if not trainer:
        text = text.replace(PLACE_ROLLOUT, "")
    config = load_config_text(text, source="async.toml")
    assert config.algorithm.options.rollout_is == expected


@pytest.mark.parametrize(
    ("rollout_dtype", "algorithm_options", "expected"),
    [
        ("bfloat16", "", "token"),  # a bfloat16 engine for the float32 policy
        ("bfloat16", 'rollout_is = "none"', "none"),
        ("float32", "", "none"),  # the policy's own dtype
        (None, "", "none"),  # unset: model.dtype
    ],
)
def test_a_rollout_in_another_dtype_is_corrected_unless_told_not_to(
    assets, tmp_path, rollout_dtype, algorithm_options, expected
):
    """A rollout plugin's ``dtype`` other than ``model.dtype`` samples from rounded weights:
    ``algorithm.rollout_is`` then defaults to ``token`` too (the vLLM plugin's Config loads
    without vLLM: discovery imports no backend)."""
    from rlcore.config import load_config_text

    text = _toml(assets, tmp_path, "", algorithm_options=algorithm_options)
    text = text.replace(PLACE_ROLLOUT, "").replace('name = "hf"', 'name = "vllm"', 1)
    if rollout_dtype is not None:
        text = text.replace('name = "vllm"', f'name = "vllm"\ndtype = "{rollout_dtype}"', 1)
    config = load_config_text(text, source="bf16.toml")
    assert config.rollout.name == "vllm"
    assert config.algorithm.options.rollout_is == expected


class _Rollout:
    """A stand-in for the split policy's rollout side: rows tagged with a fixed version (the
    queue's policy logic is under test here, not generation)."""

    def __init__(self, actor_version: int, sample_version: int) -> None:
        self.version = actor_version
        self.sample_version = sample_version
        self.calls = 0

    def generate_sequences(self, prompts, sampling):
        from rlcore.protocol import DataProto

        self.calls += 1
        versions = np.full(len(prompts), self.sample_version, dtype=np.int64)
        return DataProto.from_dict(non_tensors={"weight_version": versions})


class _Ctx:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.sampling = None

    def phase(self, name, fn, *args):
        return fn(*args)


@pytest.mark.parametrize("policy", ["drop", "reweight"])
def test_rows_beyond_the_bound_are_regenerated_or_kept_by_the_policy(policy):
    from rlcore.protocol import DataProto
    from rlcore.trainer.async_queue import AsyncSpec, StalenessError, TrajectoryQueue

    rollout = _Rollout(actor_version=5, sample_version=5)  # a regeneration is fresh
    spec = AsyncSpec(mode="fully_async", max_staleness=1, staleness_policy=policy)
    queue = TrajectoryQueue(rollout, lambda: None, spec)
    prompts = DataProto.from_dict(non_tensors={"index": np.arange(4)})
    stale = DataProto.from_dict(non_tensors={"weight_version": np.array([5, 4, 3, 3])})
    ctx = _Ctx()
    out = queue._admit(ctx, stale, prompts, "gen")
    if policy == "drop":
        assert rollout.calls == 1
        assert out.non_tensor_batch["weight_version"].tolist() == [5, 5, 5, 5]
        assert ctx.metrics["async/stale_dropped"] == 4.0
        assert ctx.metrics["training/staleness"] == 0.0
    else:
        assert rollout.calls == 0
        assert out is stale
        assert ctx.metrics["async/stale_reweighted"] == 2.0
        assert ctx.metrics["training/staleness"] == 2.0
        assert ctx.metrics["training/staleness_mean"] == pytest.approx(1.25)
    if policy == "drop":  # a regeneration that is still too old is refused, never trained
        rollout.sample_version = 3
        with pytest.raises(StalenessError, match=r"trainer\.max_staleness = 1"):
            queue._admit(_Ctx(), stale, prompts, "gen")


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        ('async_mode = "one_step_off"', ("one_step_off", 1, "drop")),
        ('async_mode = "fully_async"\nmax_staleness = 3', ("fully_async", 3, "drop")),
        (
            'async_mode = "fully_async"\nmax_staleness = 2\nstaleness_policy = "reweight"',
            ("fully_async", 2, "reweight"),
        ),
        ("", None),
    ],
)
def test_each_async_mode_means_one_spec(assets, tmp_path, trainer, expected):
    from rlcore.config import load_config_text
    from rlcore.trainer.async_queue import async_spec

    text = _toml(assets, tmp_path, trainer)
    if not trainer:
        text = text.replace(PLACE_ROLLOUT, "")
    spec = async_spec(load_config_text(text, source="async.toml").trainer)
    got = None if spec is None else (spec.mode, spec.max_staleness, spec.staleness_policy)
    assert got == expected


class _Launcher(_Rollout):
    """The split policy's launch side: records each batch launched ahead."""

    def __init__(self, actor_version: int) -> None:
        super().__init__(actor_version, actor_version)
        self.launched: list[int] = []

    def generate_async(self, prompts, sampling):
        self.launched.append(len(prompts))
        return None


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_batches_are_launched_only_while_fresh_when_trained(max_staleness):
    """The launch side of the one staleness rule: a batch sampled now at version v trains k
    updates later at v + k, so exactly ``max_staleness`` batches go ahead (0: none)."""
    import torch

    from rlcore.protocol import DataProto
    from rlcore.trainer.async_queue import AsyncSpec, TrajectoryQueue, min_fresh_version

    assert min_fresh_version(7, 2) == 5
    policy = _Launcher(actor_version=4)
    batches = iter(
        DataProto.from_dict(tensors={"input_ids": torch.zeros(2, 3, dtype=torch.long)})
        for _ in range(10)
    )

    class Ctx(_Ctx):
        n = 2

        @staticmethod
        def prompts(batch):
            return batch.pop(batch_keys=["input_ids"])

    spec = AsyncSpec(mode="fully_async", max_staleness=max_staleness)
    queue = TrajectoryQueue(policy, lambda: next(batches), spec)
    queue._top_up(Ctx())
    assert policy.launched == [4] * max_staleness  # 2 prompts x n = 2 rows each
    queue._top_up(Ctx())  # full: nothing more until one is taken
    assert len(policy.launched) == max_staleness
