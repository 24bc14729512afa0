"""The rollout on a resource pool of its own (``[resources] placement = { rollout = "gen" }``).

Real Ray, real gloo, the tiny model: the trainer's pool (``global_pool``) and the rollout's
(``gen``) are separate processes, and weights cross them over the weight bridge after every
update. The rollout's own log-probs of what it sampled match the trainer's
``compute_log_prob`` when the weights are in sync, and stop matching when a sync is skipped;
weight versions rise by one per update and are recorded on every sample. Then a whole run,
and each bad-input line (before Ray starts).
"""

from __future__ import annotations

import contextlib
import json

import attrs
import pytest
import torch

IN_SYNC = 1e-5  # float32: generate's log-probs (KV cache) against one full forward
STALE = 1e-3  # one lr=1e-2 step moves the log-probs by far more

PLACE_ROLLOUT = """placement = {{ rollout = "gen" }}
{bucket}
[resources.pools.gen]
processes_per_node = 1
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("placement")
    model = tiny_run_model(root / "model")
    rows = arithmetic_rows([(a, b) for a in range(4) for b in range(4)])
    write_jsonl(rows, root / "train.jsonl")
    write_jsonl(rows[:4], root / "val.jsonl")
    return model, root / "train.jsonl", root / "val.jsonl"


def _config(assets, tmp_path, *, bucket: str = "", extra_trainer: str = "", **kw):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml

    model, train, _ = assets
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        extra=PLACE_ROLLOUT.format(bucket=bucket),
        **kw,
    )
    text = text.replace("[trainer]\n", f"[trainer]\n{extra_trainer}\n", 1)
    return load_config_text(text, source="placement.toml")


def _masked_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool()
    return float((a - b).abs()[m].max())


@pytest.mark.slow
def test_sync_across_pools_matches_the_trainer_and_skipping_it_does_not(
    ray_session, assets, tmp_path
):
    from transformers import AutoTokenizer

    from rlcore.protocol import DataProto
    from rlcore.roles.policy import POLICY_INPUT_KEYS
    from rlcore.testing.prompts import prompt_batch
    from rlcore.trainer.builder import build_algorithm, build_workers
    from rlcore.trainer.context import DriverStepContext
    from rlcore.trainer.placement import SplitPolicy
    from rlcore.trainer.specs import build_specs

    # Buckets of 4 KiB: the tiny model's tensors travel in many broadcasts, not one.
    config = _config(assets, tmp_path, lr=1e-2, bucket="weight_sync_bucket_bytes = 4096")
    algorithm = build_algorithm(config)
    specs = build_specs(config, algorithm, total_steps=4)
    assert specs.rollout is not None
    assert specs.policy.rollout_pool == "gen"
    workers = build_workers(config, specs)
    try:
        split = workers.policy
        assert isinstance(split, SplitPolicy)
        assert workers.rollout_group is not None
        # Separate processes: the rollout is not in the trainer's workers.
        trainer_pids = {p["pid"] for p in workers.group.execute_all("rlcore_process_info")}
        rollout_pids = {p["pid"] for p in workers.rollout_group.execute_all("rlcore_process_info")}
        assert trainer_pids.isdisjoint(rollout_pids)

        tok = AutoTokenizer.from_pretrained(str(assets[0]))
        prompts = prompt_batch(tok, ["What is 1 + 2?", "2+2=", "Say hi", "x"]).repeat(
            2, interleave=True
        )
        sampling = attrs.evolve(specs.train_sampling, return_log_probs=True)

        def diff() -> tuple[float, DataProto]:
            gen = split.generate_sequences(prompts, sampling)  # prompt + response rows
            gen.meta_info.pop("metrics", None)
            old = split.compute_log_prob(gen.select(batch_keys=list(POLICY_INPUT_KEYS)))
            d = _masked_max_diff(
                old.batch["old_log_probs"],
                gen.batch["rollout_log_probs"],
                gen.batch["response_mask"],
            )
            return d, gen

        in_sync, gen = diff()
        assert in_sync < IN_SYNC, in_sync
        assert gen.non_tensor_batch["weight_version"].tolist() == [0] * len(gen)

        # One update on the trainer, the sync skipped: the rollout samples a stale policy.
        old = split.compute_log_prob(gen.select(batch_keys=list(POLICY_INPUT_KEYS)))
        old.meta_info.pop("metrics", None)
        batch = gen.union(old).union(
            DataProto.from_dict(tensors={"advantages": torch.randn(len(gen), 8)})
        )
        ctx = DriverStepContext(
            specs,
            policy=split,
            critic=None,
            algorithm=algorithm,
            reward_manager=None,  # type: ignore[arg-type]
            step=0,
            next_prompts=lambda: prompts,
        )
        split.trainer.update_actor(ctx.actor_input(batch), 0)  # the trainer's group alone
        stale, gen = diff()
        assert stale > STALE, (stale, in_sync)
        assert set(gen.non_tensor_batch["weight_version"].tolist()) == {0}

        # The sync across pools: in step again, at version 1.
        metrics = split.sync_weights(1)
        synced, gen = diff()
        assert synced < IN_SYNC, (synced, stale)
        assert set(gen.non_tensor_batch["weight_version"].tolist()) == {1}
        assert metrics["weight_sync/buckets"][0] > 10
        assert metrics["weight_sync/bytes"][0] > 0

        # update_actor through the split policy syncs by itself: +1 per update.
        for version in (2, 3):
            out = split.update_actor(ctx.actor_input(batch), version)
            assert out.meta_info["metrics"]["weight_sync/version"] == [float(version)]
            after, gen = diff()
            assert after < IN_SYNC, after
            assert set(gen.non_tensor_batch["weight_version"].tolist()) == {version}
        print(f"\nin sync {in_sync:.2e}, sync skipped {stale:.2e}, synced again {synced:.2e}")
        print(f"sync metrics {metrics}")
    finally:
        workers.shutdown()


@pytest.mark.slow
def test_a_run_with_the_rollout_on_its_own_pool(ray_session, assets, tmp_path):
    from rlcore.trainer import run_training

    config = _config(
        assets,
        tmp_path,
        total_steps=3,
        val_files=[assets[2]],
        test_freq=3,
        save_freq=1,
    )
    assert run_training(config) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    steps = [r for r in rows if "weight_sync/version" in r]
    assert [r["weight_sync/version"] for r in steps] == [1.0, 2.0, 3.0]
    # Sampled with the previous step's weights: step k generates at version k - 1.
    assert [r["rollout/weight_version"] for r in steps] == [0.0, 1.0, 2.0]
    for r in steps:
        assert r["weight_sync/bytes"] > 0
        assert r["timing_s/weight_sync"] > 0
        assert all(
            torch.isfinite(torch.tensor(r[k])) for k in ("actor/pg_loss", "critic/score/mean")
        )
    assert any("val/arithmetic/score" in r for r in rows)
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_3"
    assert (ckpt / "rollout").is_dir()
    assert (ckpt / "actor").is_dir()

    # The same run colocated (the default): the same samples, losses and scores, because the
    # rollout draws with the same seeds and the bridge delivers the trainer's exact weights.
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml

    model, train, val = assets
    colocated = load_config_text(
        tiny_run_toml(
            model=model,
            train_files=[train],
            val_files=[val],
            run_dir=tmp_path / "colocated",
            total_steps=3,
            test_freq=3,
        ),
        source="colocated.toml",
    )
    assert run_training(colocated) == 0
    lines = (tmp_path / "colocated" / "metrics.jsonl").read_text().splitlines()
    base = [r for r in (json.loads(line) for line in lines) if "actor/pg_loss" in r]
    assert len(base) == len(steps) == 3
    for a, b in zip(steps, base, strict=True):
        for key in ("actor/pg_loss", "critic/score/mean", "response_length/mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (key, a[key], b[key])

    # Resumed from step 2 in a fresh run folder: the rollout gets the restored weights at the
    # saved version (2), and step 3 repeats the unbroken run's.
    step_2 = tmp_path / "run" / "checkpoints" / "global_step_2"
    resumed = _config(
        assets,
        tmp_path / "resumed",
        total_steps=3,
        extra_trainer=f"resume = {json.dumps(str(step_2))}",
    )
    assert run_training(resumed) == 0
    lines = (tmp_path / "resumed" / "run" / "metrics.jsonl").read_text().splitlines()
    again = [r for r in (json.loads(line) for line in lines) if "actor/pg_loss" in r]
    assert [r["rollout/weight_version"] for r in again] == [2.0]
    assert [r["weight_sync/version"] for r in again] == [3.0]
    for key in ("actor/pg_loss", "critic/score/mean", "response_length/mean"):
        assert again[0][key] == pytest.approx(steps[2][key], abs=1e-6), key


@pytest.mark.slow
def test_one_step_off_generates_ahead_with_staleness_one(ray_session, assets, tmp_path):
    """Batch k+1 generates (at version k) while batch k trains; rollout_is corrects it."""
    from rlcore.trainer import run_training

    config = _config(
        assets,
        tmp_path,
        total_steps=3,
        lr=1e-2,
        # An entropy bonus moves the weights even where every reward is 0 (the tiny model).
        algorithm_options='rollout_is = "token"\nentropy_coeff = 0.1',
        extra_trainer='async_mode = "one_step_off"',
    )
    assert config.trainer.async_mode == "one_step_off"
    assert run_training(config) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in (json.loads(line) for line in lines) if "actor/pg_loss" in r]
    assert [r["weight_sync/version"] for r in steps] == [1.0, 2.0, 3.0]
    # Step 1 generates synchronously (version 0); steps 2 and 3 train on samples generated
    # during the previous step, one version behind the actor.
    assert [r["rollout/weight_version"] for r in steps] == [0.0, 0.0, 1.0]
    assert [r["training/staleness"] for r in steps] == [0.0, 1.0, 1.0]
    assert [r["training/staleness_min"] for r in steps] == [0.0, 1.0, 1.0]
    # The old-log-prob pass sees the stale samples: the mismatch grows once off-policy, and
    # rollout_is (truncated importance weights) is applied to the loss.
    diffs = [r["rollout/logprob_diff_max"] for r in steps]
    assert diffs[0] < 1e-4, diffs
    assert min(diffs[1:]) > 10 * diffs[0], diffs
    assert all("actor/rollout_is_mean" in r for r in steps)
    assert abs(steps[0]["actor/rollout_is_mean"] - 1.0) < 1e-3
    print(f"\nlogprob_diff_max per step {diffs}")
    print(f"rollout_is_mean per step {[r['actor/rollout_is_mean'] for r in steps]}")


def test_one_step_off_needs_the_rollout_on_its_own_pool(tmp_path, assets, capsys):
    import _bad_inputs as bi

    from rlcore.plugins import PluginRegistry
    from rlcore.testing.runs import tiny_run_toml

    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    config = tmp_path / "run.toml"
    config.write_text(tiny_run_toml(model=assets[0], train_files=[assets[1]], run_dir=tmp_path))
    code, err = bi.cli(
        ["config", "validate", str(config), 'trainer.async_mode="one_step_off"'], capsys, registry
    )
    bi.assert_one_line(
        code,
        err,
        f"{config}: trainer.async_mode: 'one_step_off' needs the rollout on a pool of its own; "
        'set resources.placement.rollout = "NAME" and [resources.pools.NAME]',
    )


# --- bad inputs: one line each, before Ray starts ------------------------------------------

BAD = [
    (
        ['resources.placement.rollout="gn"', "resources.pools.gen.processes_per_node=1"],
        "resources.placement.rollout: pool 'gn' is not defined (defined: global_pool, gen); "
        "add [resources.pools.gn] or name a defined pool",
    ),
    (
        ['resources.placement.actor="gen"', "resources.pools.gen.processes_per_node=1"],
        "resources.placement.actor: role 'actor' cannot be placed on a pool of its own "
        "(placeable: rollout, rm, a judge's or an algorithm's frozen role); the actor, "
        "reference and critic stay on 'global_pool'",
    ),
    (
        ["resources.pools.gen.processes_per_node=1"],
        "resources.pools.gen: no role is placed on pool 'gen'; set "
        'resources.placement.rollout = "gen" or remove the table',
    ),
    (
        ['resources.placement.rollout="global_pool"', "resources.pools.global_pool.nnodes=1"],
        "resources.pools.global_pool: 'global_pool' is the implicit pool of resources.nnodes "
        "x resources.processes_per_node; give the new pool another name",
    ),
    (
        ['resources.placement.rollout="gen"', "resources.pools.gen.processes_per_node=0"],
        "resources.pools.gen.processes_per_node: must be >= 1, got 0",
    ),
    (
        ['resources.placement.rollout="gen"', "resources.pools.gen.cpus_per_process=0"],
        "resources.pools.gen.cpus_per_process: must be > 0.0, got 0.0",
    ),
    (
        ["resources.weight_sync_bucket_bytes=0"],
        "resources.weight_sync_bucket_bytes: must be >= 1, got 0",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[c[1][:40] for c in BAD])
def test_placement_config_errors(tmp_path, assets, capsys, overrides, message):
    import _bad_inputs as bi

    from rlcore.plugins import PluginRegistry

    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    config = tmp_path / "run.toml"
    _, train, _ = assets
    from rlcore.testing.runs import tiny_run_toml

    config.write_text(tiny_run_toml(model=assets[0], train_files=[train], run_dir=tmp_path / "r"))
    code, err = bi.cli(["config", "validate", str(config), *overrides], capsys, registry)
    bi.assert_one_line(code, err, f"{config}: {message}")


def test_pools_asking_for_more_cpus_than_the_machine_has(tmp_path, assets, capsys, monkeypatch):
    """``rlcore train`` refuses before Ray starts (preflight), naming the pools and counts."""
    import os

    import _bad_inputs as bi

    from rlcore.plugins import PluginRegistry

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    have = os.cpu_count() or 1
    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    config = tmp_path / "run.toml"
    _, train, _ = assets
    from rlcore.testing.runs import tiny_run_toml

    config.write_text(tiny_run_toml(model=assets[0], train_files=[train], run_dir=tmp_path / "r"))
    over = ['resources.placement.rollout="gen"', f"resources.pools.gen.processes_per_node={have}"]
    code, err = bi.cli(["train", str(config), *over], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"resources.pools: the pools ask for {have + 1:g} CPUs (resources 1 x 1 + "
        f"resources.pools.gen {have} x 1), this machine has {have}; lower "
        "processes_per_node or cpus_per_process, or join a cluster (resources.ray_address)",
    )


def test_local_pool_check_is_pure():
    from rlcore.config.schema import PoolConfig, ResourcesConfig
    from rlcore.errors import ResourceError
    from rlcore.workers.cluster import check_local_pools, ray_init_kwargs

    one = ResourcesConfig()
    check_local_pools(one, cpu_count=1)  # the default is never refused here
    split = ResourcesConfig(pools={"gen": PoolConfig()}, placement={"rollout": "gen"})
    check_local_pools(split, cpu_count=2)
    with pytest.raises(ResourceError, match=r"ask for 2 CPUs .* this machine has 1"):
        check_local_pools(split, cpu_count=1)
    gpu = attrs.evolve(split, device="cuda")
    with pytest.raises(ResourceError, match=r"ask for 2 GPUs .* this machine has 1"):
        check_local_pools(gpu, cpu_count=8, gpu_count=1)
    multi = attrs.evolve(split, pools={"gen": PoolConfig(nnodes=2)})
    with pytest.raises(ResourceError, match=r"^resources.pools.gen.nnodes = 2 needs a Ray"):
        check_local_pools(multi, cpu_count=8)
    # The local Ray gets logical CPUs for every pool (the default: as before).
    assert ray_init_kwargs(one, environ={})["num_cpus"] >= 2
    big = attrs.evolve(split, pools={"gen": PoolConfig(processes_per_node=64)})
    with pytest.raises(ResourceError):
        ray_init_kwargs(big, environ={})


def test_the_default_places_nothing_apart(assets, tmp_path):
    """No [resources.pools]: one pool, the rollout in the policy worker, as before."""
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml
    from rlcore.trainer.builder import build_algorithm
    from rlcore.trainer.specs import build_specs

    model, train, _ = assets
    config = load_config_text(
        tiny_run_toml(model=model, train_files=[train], run_dir=tmp_path / "r"), source="t"
    )
    assert config.resources.separate_rollout() is None
    specs = build_specs(config, build_algorithm(config), total_steps=2)
    assert specs.rollout is None
    assert specs.policy.rollout_pool is None


# --- the bridge alone: buckets, and every wait bounded -------------------------------------


def test_buckets_hold_one_dtype_and_at_most_the_bucket_size():
    from rlcore.workers.weight_bridge import TensorMeta, plan_buckets

    manifest = [
        TensorMeta("a", (4, 4), "float32"),  # 64 B
        TensorMeta("b", (8,), "float32"),  # 32 B
        TensorMeta("c", (100,), "float32"),  # 400 B: alone, larger than a bucket
        TensorMeta("d", (4,), "bfloat16"),  # another dtype: a new bucket
        TensorMeta("e", (4,), "float32"),
    ]
    assert plan_buckets(manifest, 96) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(manifest, 1 << 20) == [[0, 1, 2], [3], [4]]


def _bridge(port: int, rank: int, manifest, timeout_s: float = 2.0):
    from rlcore.workers.weight_bridge import WeightBridge

    return WeightBridge(
        addr="127.0.0.1",
        port=port,
        rank=rank,
        world_size=2,
        backend="gloo",
        timeout_s=timeout_s,
        pools="'global_pool' (trainer) and 'gen' (rollout)",
        manifest=manifest,
        bucket_bytes=64,
    )


def test_weights_cross_a_bridge_exactly_and_a_wrong_version_is_refused():
    import threading

    from rlcore.workers.weight_bridge import WeightSyncError, manifest_of
    from rlcore.workers.worker import find_free_port

    named = [("w", torch.randn(5, 7)), ("b", torch.randn(7)), ("h", torch.randn(3, 3).half())]
    manifest = manifest_of(iter(named))
    port = find_free_port()
    bridges: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda r=r: bridges.__setitem__(r, _bridge(port, r, manifest)))
        for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sender, receiver = bridges[0], bridges[1]
    got: dict[str, torch.Tensor] = {}
    recv = threading.Thread(
        target=lambda: got.update({n: t.clone() for n, t in receiver.receive(3)})  # type: ignore[attr-defined]
    )
    recv.start()
    metrics = sender.send(iter(named), 3)  # type: ignore[attr-defined]
    recv.join(30)
    assert list(got) == ["w", "b", "h"]
    for name, tensor in named:
        assert torch.equal(got[name], tensor)
        assert got[name].dtype == tensor.dtype
    assert metrics["weight_sync/buckets"] == 3.0  # 140 B of float32 over 64 B buckets: w, b; h
    # A receiver expecting version 5 while version 4 arrives: one line naming both.
    errors: list[BaseException] = []

    def expect_5() -> None:
        try:
            list(receiver.receive(5))  # type: ignore[attr-defined]
        except WeightSyncError as err:
            errors.append(err)

    recv = threading.Thread(target=expect_5)
    recv.start()
    with contextlib.suppress(WeightSyncError):  # the sender finishes or times out alone
        sender.send(iter(named), 4)  # type: ignore[attr-defined]
    recv.join(30)
    assert errors, "the receiver accepted the wrong version"
    assert "[version, tensors, elements] = [4, 3, 51], the rollout expected [5, 3, 51]" in str(
        errors[0]
    )


def test_a_bridge_peer_that_never_comes_is_an_error_naming_the_pools_within_the_timeout():
    import time

    from rlcore.workers.weight_bridge import WeightSyncError
    from rlcore.workers.worker import find_free_port

    start = time.monotonic()
    with pytest.raises(WeightSyncError) as err:
        _bridge(find_free_port(), 0, [], timeout_s=2.0)  # rank 1 never joins
    waited = time.monotonic() - start
    assert waited < 30, waited
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(
        "weight sync between pools 'global_pool' (trainer) and 'gen' (rollout): opening the "
        "group did not complete within 2 s (resources.collective_timeout_s)"
    ), line


def test_a_sender_that_stops_sending_times_the_receiver_out():
    import threading
    import time

    from rlcore.workers.weight_bridge import WeightSyncError, manifest_of
    from rlcore.workers.worker import find_free_port

    manifest = manifest_of(iter([("w", torch.zeros(4))]))
    port = find_free_port()
    bridges: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda r=r: bridges.__setitem__(r, _bridge(port, r, manifest)))
        for r in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"weight version 1 \(header\) did not complete"):
        list(bridges[1].receive(1))  # type: ignore[attr-defined]
    assert time.monotonic() - start < 30
