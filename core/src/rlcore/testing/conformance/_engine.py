"""``check_engine``: an actor engine trains, syncs HF-named weights and checkpoints exactly."""

from __future__ import annotations

import tempfile
from typing import Any

from rlcore.interfaces import BaseEngine, BatchTotals, EngineSpec, ModelOutputs, OptimConfig
from rlcore.protocol import DataProto
from rlcore.testing.conformance._common import check_config, check_subclass, fail, name_of

__all__ = ["check_engine", "random_engine_batch"]

_PROMPT, _RESPONSE, _ROWS = 6, 5, 6


def random_engine_batch(vocab_size: int, *, seed: int = 0) -> DataProto:
    """Left-padded prompts (B, P), right-padded responses (B, R) with masked tails: (6, 6+5)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    width = _PROMPT + _RESPONSE
    ids = torch.randint(3, vocab_size, (_ROWS, width), generator=g)
    attn = torch.ones(_ROWS, width, dtype=torch.long)
    resp_mask = torch.ones(_ROWS, _RESPONSE, dtype=torch.long)
    for i in range(_ROWS):
        attn[i, : i % _PROMPT] = 0  # 0..P-1 left-padding tokens
        cut = _RESPONSE - (i % 3)  # 0-2 masked tokens after the response ended
        resp_mask[i, cut:] = 0
        attn[i, _PROMPT + cut :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "prompts": ids[:, :_PROMPT],
            "responses": ids[:, _PROMPT:],
            "response_mask": resp_mask,
            "advantages": torch.randn(_ROWS, _RESPONSE, generator=g),
        }
    )


def _loss(
    outputs: ModelOutputs, mb: DataProto, totals: BatchTotals
) -> tuple[Any, dict[str, float]]:
    """A policy-gradient-shaped token-mean loss over the mini-batch totals."""
    if outputs.log_probs is None:
        msg = "the engine passed ModelOutputs without log_probs to the loss function"
        raise AssertionError(msg)
    mask = mb.batch["response_mask"].to(outputs.log_probs.dtype)
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / max(totals.tokens, 1)
    return loss, {"conformance/loss": float(loss.detach())}


def _hf_log_probs(model: Any, batch: DataProto) -> Any:
    """Reference log-probs of ``responses`` under a plain transformers model: (B, R)."""
    import torch

    b = batch.batch
    r = b["responses"].shape[1]
    with torch.no_grad():
        logits = (
            model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                position_ids=b["position_ids"],
            )
            .logits[:, -(r + 1) : -1]
            .float()
        )
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def check_engine(
    cls: type[BaseEngine],
    config: BaseEngine.Config | None = None,
    *,
    model_path: str,
    atol: float = 1e-4,
) -> None:
    """Check an engine class against :class:`~rlcore.interfaces.BaseEngine` in one process.

    Builds an actor (float32, AdamW lr 1e-2, micro-batches of 2 rows) from ``model_path`` (a
    tiny HF causal LM, e.g. :func:`rlcore.testing.tiny_model.build_tiny_model`) inside a
    1-rank gloo group (created, and destroyed afterwards, when none is initialised), then:
    ``compute_log_prob`` gives finite (B, R) log-probs (<= 0) equal to transformers' within
    ``atol``; ``forward_backward`` + ``optimizer_step`` return float metrics and a finite grad
    norm and change the parameters; ``named_parameters_for_sync`` yields every parameter under
    its HF name, and ``AutoModelForCausalLM.from_pretrained(model_path)`` loaded with them
    gives the engine's log-probs; ``save_checkpoint``/``load_checkpoint`` restores log-probs
    exactly after a further step.
    """
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    check_subclass(cls, BaseEngine)
    what = name_of(cls)
    config = check_config(cls, config, "actor.engine")
    created = False
    if not dist.is_initialized():
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        created = True
    try:
        spec = EngineSpec(
            role="actor", model_path=model_path, optim=OptimConfig(lr=1e-2), micro_batch_size=2
        )
        engine = cls(spec, config)
        reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        batch = random_engine_batch(int(reference.config.vocab_size))
        shape = tuple(batch.batch["responses"].shape)

        def log_probs(rule: str) -> torch.Tensor:
            engine.eval_mode()
            out = engine.compute_log_prob(batch)
            lp = out.log_probs if isinstance(out, ModelOutputs) else None
            if lp is None or tuple(lp.shape) != shape:
                fail(what, rule, f"expected ModelOutputs.log_probs of shape {shape}, got {out!r}")
            if not bool(torch.isfinite(lp).all()) or bool((lp > 1e-6).any()):
                fail(what, rule, "log-probs must be finite and <= 0")
            return lp.detach().cpu().float()

        rule = "compute_log_prob must return (B, R) log-probs of responses"
        before = log_probs(rule)
        expected = _hf_log_probs(reference, batch)
        if not torch.allclose(before, expected, atol=atol, rtol=0):
            diff = float((before - expected).abs().max())
            fail(
                what,
                "compute_log_prob must equal transformers' log-probs of the same model "
                "(left padding, position_ids, responses aligned)",
                f"max difference {diff:.3g} > atol={atol:g}",
            )
        with_entropy = engine.compute_log_prob(batch, with_entropy=True)
        ent = with_entropy.entropy
        if ent is None or tuple(ent.shape) != shape or not bool((ent >= -1e-6).all()):
            fail(
                what,
                "compute_log_prob(with_entropy=True) must return (B, R) entropy >= 0",
                repr(ent),
            )

        def params() -> dict[str, torch.Tensor]:
            return {
                n: t.detach().cpu().float().clone() for n, t in engine.named_parameters_for_sync()
            }

        initial = params()
        hf_names = dict(reference.state_dict())
        unknown = sorted(set(initial) - set(hf_names))
        if unknown:
            fail(
                what,
                "named_parameters_for_sync must use Hugging Face parameter names",
                f"not in AutoModelForCausalLM's state_dict: {unknown[:5]}",
            )
        missing = sorted(n for n, _ in reference.named_parameters() if n not in initial)
        if missing:
            fail(
                what,
                "named_parameters_for_sync must yield every parameter",
                f"missing {missing[:5]}",
            )

        rule = "forward_backward + optimizer_step must train the model"
        engine.train_mode()
        metrics = engine.forward_backward(batch, _loss)
        if not isinstance(metrics, dict) or not all(
            isinstance(v, float | int) for v in metrics.values()
        ):
            fail(
                what, rule, f"forward_backward must return a dict of float metrics, got {metrics!r}"
            )
        grad_norm = engine.optimizer_step()
        if not isinstance(grad_norm, float | int) or not torch.isfinite(
            torch.tensor(float(grad_norm))
        ):
            fail(what, rule, f"optimizer_step must return a finite grad norm, got {grad_norm!r}")
        if float(grad_norm) <= 0.0:
            fail(what, rule, f"grad norm is {grad_norm}: no gradient reached the parameters")
        trained = params()
        if all(torch.equal(trained[n], initial[n]) for n in initial):
            fail(what, rule, "no parameter changed after an optimizer step")
        after = log_probs("compute_log_prob after a step")

        # The synced weights, loaded into a plain transformers model, give the engine's outputs.
        reference.load_state_dict(trained, strict=False)
        synced = _hf_log_probs(reference, batch)
        if not torch.allclose(after, synced, atol=atol, rtol=0):
            diff = float((after - synced).abs().max())
            fail(
                what,
                "weights from named_parameters_for_sync loaded into "
                "AutoModelForCausalLM.from_pretrained(model_path) must reproduce the engine",
                f"log-probs differ by {diff:.3g} > atol={atol:g}",
            )

        with tempfile.TemporaryDirectory(prefix="rlcore-conformance-") as tmp:
            engine.save_checkpoint(tmp)
            engine.train_mode()
            engine.forward_backward(batch, _loss)
            engine.optimizer_step()
            moved = log_probs("compute_log_prob after a second step")
            engine.load_checkpoint(tmp)
            restored = log_probs("compute_log_prob after load_checkpoint")
        if torch.equal(moved, after):
            fail(what, "a second optimizer step must change the model", "log-probs unchanged")
        if not torch.equal(restored, after):
            diff = float((restored - after).abs().max())
            fail(
                what,
                "load_checkpoint must restore what save_checkpoint saved exactly",
                f"log-probs differ by {diff:.3g}",
            )
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
