"""Issue 16's update levers on the real FSDP2 engine: each one leaves the update unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.protocol import DataProto
from rlcore.rl.algorithm import PolicyGradientAlgorithm
from rlcore.roles.levers import drop_zero_advantage_rows, with_totals
from rlcore.roles.update import RoleTrainer
from rlcore.trainer.specs import UpdateSpec
from rlcore_fsdp2.engine import FSDP2Engine

torch.set_num_threads(1)


class PolicyLoss(PolicyGradientAlgorithm):
    """The core's policy loss (vanilla clipped PG, token-mean); advantages come with the data."""

    def compute_advantages(self, batch: DataProto) -> DataProto:
        return batch


LR = 1e-5  # one AdamW step moves each weight by about LR: well above the 1e-6 tolerance


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(
        build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=64, heads=2, kv_heads=1)
    )


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def make_batch(groups: int = 4, n: int = 3, prompt: int = 6, response: int = 5) -> DataProto:
    """GRPO-shaped rows: group 0 and 2 have all-equal rewards (advantage 0 on every row)."""
    rows = groups * n
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones(rows, prompt + response, dtype=torch.long)
    resp_mask = torch.ones(rows, response, dtype=torch.long)
    for i in range(rows):
        attn[i, : i % prompt] = 0
        cut = response - (i % 3)
        resp_mask[i, cut:] = 0
        attn[i, prompt + cut :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    per_row = torch.randn(rows, 1, generator=g)
    per_row[0:n] = 0.0
    per_row[2 * n : 3 * n] = 0.0
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": resp_mask,
            "advantages": per_row.expand(rows, response) * resp_mask,
        }
    )


def engine(path: str) -> FSDP2Engine:
    spec = EngineSpec(role="actor", model_path=path, optim=OptimConfig(lr=LR), micro_batch_size=4)
    return FSDP2Engine(spec, FSDP2Engine.Config())


def update_spec(epochs: int = 1, mini_batches: int = 1) -> UpdateSpec:
    return UpdateSpec(
        rows_per_mini_batch=12 // mini_batches,
        mini_batches=mini_batches,
        epochs=epochs,
        shuffle=False,
        seed=0,
        optim=OptimConfig(lr=LR),
        schedule_steps=10,
    )


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def params(e: FSDP2Engine) -> dict[str, torch.Tensor]:
    return {n: full(p) for n, p in e.model.named_parameters()}


def grads(e: FSDP2Engine) -> dict[str, torch.Tensor]:
    return {n: full(p.grad) for n, p in e.model.named_parameters()}


def run_step(e: FSDP2Engine, data: DataProto, *, skip: bool = False, **update_kw) -> dict:
    metrics: dict[str, list[float]] = {}
    algo = PolicyLoss()
    trainer = RoleTrainer("actor", e, update_spec(**update_kw), skip_zero_advantage_rows=skip)
    trainer.run(
        algo.policy_loss,
        data,
        step=0,
        temperature=1.0,
        with_entropy=False,
        metrics=metrics,
        timing={},
    )
    return metrics


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_old_log_probs_from_the_training_forward_give_the_same_update(tiny_path):
    data = make_batch()
    initial = params(engine(tiny_path))

    # The separate pass: old log-probs from compute_log_prob, as the driver does off-policy.
    separate = engine(tiny_path)
    with_old = data.select(batch_keys=list(data.batch))
    with_old.batch["old_log_probs"] = separate.compute_log_prob(data, temperature=1.0).log_probs
    run_step(separate, with_old)

    # On-policy: no old_log_probs sent; the trainer takes them from the training forward.
    fused = engine(tiny_path)
    run_step(fused, data)

    assert max_diff(params(separate), initial) > 10 * 1e-6  # the step did move the weights
    assert max_diff(params(fused), params(separate)) <= 1e-6


def test_missing_old_log_probs_off_policy_is_an_error(tiny_path):
    with pytest.raises(RuntimeError, match="needed off-policy"):
        run_step(engine(tiny_path), make_batch(), epochs=2)


def test_zero_advantage_rows_skipped_keep_the_gradient(tiny_path):
    data = make_batch()
    old = engine(tiny_path).compute_log_prob(data, temperature=1.0).log_probs
    data.batch["old_log_probs"] = old + 0.05  # off-policy ratios: clipping matters too
    loss_fn = PolicyLoss().policy_loss

    reference = engine(tiny_path)
    reference.forward_backward(data, loss_fn, temperature=1.0)

    kept, totals = drop_zero_advantage_rows(data)
    assert len(kept) == 6  # groups 0 and 2 (3 rows each) dropped
    assert totals.tokens == int(data.batch["response_mask"].sum())
    skipped = engine(tiny_path)
    skipped.forward_backward(kept, with_totals(loss_fn, totals), temperature=1.0)
    assert max_diff(grads(skipped), grads(reference)) <= 1e-6

    # Without the full batch's totals the token-mean would divide by fewer tokens.
    wrong = engine(tiny_path)
    wrong.forward_backward(kept, loss_fn, temperature=1.0)
    assert max_diff(grads(wrong), grads(reference)) > 1e-6


def test_trainer_skips_zero_advantage_rows_with_the_same_update(tiny_path):
    data = make_batch()
    plain = engine(tiny_path)
    run_step(plain, data)
    skipping = engine(tiny_path)
    metrics = run_step(skipping, data, skip=True)
    assert metrics["actor/skipped_rows_frac"] == [0.5]
    assert max_diff(params(skipping), params(plain)) <= 1e-6


def test_all_zero_advantages_keep_one_row():
    data = make_batch()
    data.batch["advantages"] = torch.zeros_like(data.batch["advantages"])
    kept, _ = drop_zero_advantage_rows(data)
    assert len(kept) == 1
