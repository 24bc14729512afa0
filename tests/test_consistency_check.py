"""The training-inference consistency check (issue 44 item 4) on the tiny run model.

The real HF rollout against the real FSDP2 engine in one process: on the same weights the
check passes; after one engine update the rollout was not synced with (one sync behind, the
control) it fails and names the first drifted layer. ``rlcore check consistency`` on the tiny
run's config prints the table and exits 0.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlcore.interfaces import (
    BaseRollout,
    EngineSpec,
    OptimConfig,
    RolloutSpec,
    SamplingParams,
)
from rlcore.testing.conformance import (
    check_consistency,
    compare_distributions,
    measure_consistency,
)
from rlcore.testing.prompts import prompt_batch
from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl

_TEXTS = ("What is 2 + 3?", "Add 7 and 9.", "abc def", "Say a long sentence, please.")


@contextlib.contextmanager
def _one_rank():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(tiny_run_model(tmp_path_factory.mktemp("m")))


def test_compare_distributions_by_hand():
    # Position 0: p = (1/2, 1/2), q = (1/4, 3/4) over 2 tokens; position 1: identical; 2: masked.
    p = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1], [1.0, 1e-9]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1], [1e-9, 1.0]]]))
    mask = torch.tensor([[1, 1, 0]])
    labels = torch.tensor([[1, 0, 0]])
    m = compare_distributions(p, q, mask, labels, top_k=1)
    kl_pq = 0.5 * torch.log(torch.tensor(2.0, dtype=torch.float64)) + 0.5 * torch.log(
        torch.tensor(2 / 3, dtype=torch.float64)
    )
    kl_qp = 0.25 * torch.log(torch.tensor(0.5, dtype=torch.float64)) + 0.75 * torch.log(
        torch.tensor(1.5, dtype=torch.float64)
    )
    zero = torch.zeros((), dtype=torch.float64)
    assert torch.allclose(m["kl_trainer_rollout"], torch.stack([kl_pq, zero]), atol=1e-7)
    assert torch.allclose(m["kl_rollout_trainer"], torch.stack([kl_qp, zero]), atol=1e-7)
    assert torch.allclose(m["total_variation"], torch.tensor([0.25, 0.0], dtype=torch.float64))
    # top-1: p's argmax is token 0 (a tie broken to the first), q's token 1: no overlap.
    assert m["top_k_overlap"].tolist()[1] == 1.0
    assert m["top_k_overlap"].tolist()[0] == 0.0
    # The response token at position 0 is token 1: |log 1/2 - log 3/4| = log 1.5.
    assert m["log_prob_abs_diff"][0].item() == pytest.approx(0.4054651, abs=1e-6)


def test_in_sync_passes_one_sync_behind_fails(model_path):
    from transformers import AutoTokenizer

    from rlcore_fsdp2.engine import FSDP2Engine
    from rlcore_hf.rollout import HFRollout

    with _one_rank():
        engine = FSDP2Engine(
            EngineSpec(
                role="actor",
                model_path=model_path,
                optim=OptimConfig(lr=1e-2),
                micro_batch_size=4,
                dtype="float32",
                total_steps=1,
            ),
            FSDP2Engine.Config(use_remove_padding=False),
        )
        rollout = HFRollout(
            RolloutSpec(model_path=model_path, max_prompt_length=32, max_response_length=8)
        )
        rollout.update_weights(engine.named_parameters_for_sync())
        prompts = prompt_batch(AutoTokenizer.from_pretrained(model_path), _TEXTS)
        rows = rollout.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8))

        report = check_consistency(rollout, engine, rows)  # in sync: passes
        assert report.worst_kl < 1e-6, report.table()
        assert report.metrics["top_k_overlap"][1] == 1.0

        # One update on the engine, not synced: the rollout is one sync behind.
        batch = rows.select(
            batch_keys=["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
        )
        batch.batch["advantages"] = torch.randn(rows.batch["responses"].shape)

        def loss_fn(outputs, mb, totals):
            mask = mb.batch["response_mask"].to(outputs.log_probs.dtype)
            loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
            return loss, {}

        engine.forward_backward(batch, loss_fn, temperature=1.0)
        engine.optimizer_step(lr=1e-2)
        behind = measure_consistency(rollout, engine, rows)
        assert not behind.passed, behind.table()
        # Every layer's weights moved: the first decoder layer is already past the bound.
        assert behind.first_layer == 0, behind.table()
        with pytest.raises(AssertionError, match="within KL"):
            check_consistency(rollout, engine, rows)

        rollout.update_weights(engine.named_parameters_for_sync())  # synced again: passes
        assert check_consistency(rollout, engine, rows).worst_kl < 1e-6

        # A rollout without the optional method is refused in one line naming it.
        class NoDistributions(HFRollout):
            next_token_distributions = BaseRollout.next_token_distributions

        bare = object.__new__(NoDistributions)
        with pytest.raises(AssertionError, match="NoDistributions cannot return") as err:
            check_consistency(bare, engine, rows)
        assert "\n" not in str(err.value)


def test_command_prints_the_table(model_path, tmp_path, capsys):
    from rlcore.cli import main

    train = write_jsonl(arithmetic_rows([(1, 2), (3, 4), (5, 6)]), tmp_path / "train.jsonl")
    toml = tmp_path / "run.toml"
    toml.write_text(tiny_run_toml(model=model_path, train_files=[train], run_dir=tmp_path / "run"))
    code = main(["check", "consistency", str(toml), "--prompts", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    for metric in ("kl_trainer_rollout", "kl_rollout_trainer", "total_variation", "top_k_overlap"):
        assert metric in out
    assert "ok: worst KL" in out
