"""The frozen roles on a resource pool of their own (``resources.placement``): the reward
model (``rm``) and a judge placed together on ``[resources.pools.aux]`` score exactly as they
do colocated with the policy. Real Ray, FSDP2 for the reward model, the HF rollout for the
judge; the bad inputs are one line before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

import _bad_inputs as bi
import pytest

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures

JUDGE = """
[reward.options.judge]
model_path = {model}
template = "Q: {{prompt}}\\nA: {{response}}\\nRate 0-9:"
score_pattern = "([0-9])"
last_number = true
scale = [0.0, 9.0]
max_prompt_length = 48
max_new_tokens = 6
temperature = 1.0  # sampled (seeded per rank): some judgements hold a digit and parse
unparseable_score = 0.25
timeout_s = 120

[reward_model]
enable = true
model = {{ path = {rm} }}
weight = 2.0
micro_batch_size = 3
"""

PLACED = """placement = { rm = "aux", judge = "aux" }

[resources.pools.aux]
processes_per_node = 1
"""


def _samples(run_dir: Path) -> dict[int, list[dict]]:
    """``trainer.rollout_data_dir``: each step's trained rows (uid order)."""
    return {
        int(p.stem): sorted(map(json.loads, p.read_text().splitlines()), key=lambda r: r["uid"])
        for p in (run_dir / "samples").glob("*.jsonl")
    }


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r for r in rows if "reward/scorer/rm/mean" in r}


@pytest.mark.slow
def test_reward_model_and_judge_on_their_own_pool_score_as_colocated(ray_session, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.testing.tiny_model import build_tiny_reward_model
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    rm = build_tiny_reward_model(tmp_path / "rm", from_model=model, seed=3)
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), tmp_path / "train.jsonl")
    sections = JUDGE.format(model=json.dumps(str(model)), rm=json.dumps(str(rm)))
    runs = {}
    for name, placed in (("colocated", ""), ("placed", PLACED)):
        run_dir = tmp_path / name
        text = tiny_run_toml(
            model=model,
            train_files=[train],
            run_dir=run_dir,
            total_steps=2,
            rewards=("judge",),
            experiment_name=f"roles-{name}",
            extra=placed + sections,
        ).replace("[trainer]\n", f'[trainer]\nrollout_data_dir = "{run_dir / "samples"}"\n', 1)
        config = load_config_text(text, source=f"{name}.toml")
        assert config.resources.pool_of("rm") == ("aux" if placed else "global_pool")
        assert run_training(config) == 0
        runs[name] = (_samples(run_dir), _metrics(run_dir))

    (colocated, colocated_metrics), (placed, placed_metrics) = runs["colocated"], runs["placed"]
    assert sorted(placed) == sorted(colocated) == [1, 2]
    for step in (1, 2):
        # The same rows (same seeds, same weights), scored alike row by row: rm x 2 + judge.
        assert [r["uid"] for r in placed[step]] == [r["uid"] for r in colocated[step]]
        for a, b in zip(placed[step], colocated[step], strict=True):
            assert a["score"] == pytest.approx(b["score"], abs=1e-6), (step, a, b)
        p, c = placed_metrics[step], colocated_metrics[step]
        for key in (
            "reward/scorer/rm/mean",
            "reward/scorer/judge/mean",
            "reward/scorer/judge/unparseable",
            "critic/score/mean",
        ):
            assert p[key] == pytest.approx(c[key], abs=1e-6), (step, key)
        assert p["reward/scorer/rm/mean"] != 0.0
        print(f"step {step}: rm mean {p['reward/scorer/rm/mean']:.6f}, judge mean "
              f"{p['reward/scorer/judge/mean']:.4f}, unparseable "
              f"{p['reward/scorer/judge/unparseable']:.0f}")  # fmt: skip


# --- bad inputs: one line each, before Ray starts ------------------------------------------


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory, tiny):
    from rlcore.testing.tiny_model import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", from_model=tiny, seed=3)


def _rm_on(folder) -> list[str]:
    return ["reward_model.enable=true", f'reward_model.model.path="{folder}"']


def test_a_placed_role_the_run_does_not_have_is_one_line(run, capsys, registry, reward_model):
    bi.case(
        run,
        capsys,
        registry,
        [*_rm_on(reward_model), 'resources.placement.judge="aux"', "resources.pools.aux.nnodes=1"],
        "resources.placement.judge: this run has no role 'judge' (roles that may be placed "
        "here: rollout, rm)",
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ['resources.placement.rm="aux"', "resources.pools.aux.nnodes=1"],
            "resources.placement.rm: the reward model is not enabled; set "
            "reward_model.enable = true or remove it",
        ),
        (
            [
                *_rm_on("rm"),
                'resources.placement.rollout="gen"',
                'resources.placement.rm="gen"',
                "resources.pools.gen.nnodes=1",
            ],
            "resources.placement.rm: pool 'gen' holds the rollout, which keeps its pool to "
            "itself (the weight bridge spans its processes); place 'rm' on another pool",
        ),
        (
            [*_rm_on("rm"), 'resources.placement.rm="ax"', "resources.pools.aux.nnodes=1"],
            "resources.placement.rm: pool 'ax' is not defined (defined: global_pool, aux); "
            "add [resources.pools.ax] or name a defined pool",
        ),
    ],
    ids=["rm-not-enabled", "rm-on-the-rollout-pool", "undefined-pool"],
)
def test_placing_the_reward_model_wrongly_is_one_line(run, capsys, overrides, message, registry):
    code, err = bi.cli(["config", "validate", str(run), *overrides], capsys, registry)
    bi.assert_one_line(code, err, f"{run}: {message}")


def test_a_reward_model_pool_larger_than_the_machine_is_one_line(
    run, capsys, registry, reward_model, monkeypatch
):
    import os

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    have = os.cpu_count() or 1
    over = ['resources.placement.rm="aux"', f"resources.pools.aux.processes_per_node={have}"]
    bi.case(
        run,
        capsys,
        registry,
        [*_rm_on(reward_model), *over],
        f"resources.pools: the pools ask for {have + 1:g} CPUs (resources 1 x 1 + "
        f"resources.pools.aux {have} x 1), this machine has {have}; lower "
        "processes_per_node or cpus_per_process, or join a cluster (resources.ray_address)",
    )
