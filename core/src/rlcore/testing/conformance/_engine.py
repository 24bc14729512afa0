"""``check_engine``: an actor engine trains, syncs HF-named weights and checkpoints exactly."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from typing import Any

import attrs

from rlcore.interfaces import BaseEngine, BatchTotals, EngineSpec, ModelOutputs, OptimConfig
from rlcore.protocol import DataProto
from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_class

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


def _token_mean_loss(
    field: str, to: str, metric: str, token_losses: Callable[[Any, DataProto], Any]
) -> Callable[[ModelOutputs, DataProto, BatchTotals], tuple[Any, dict[str, float]]]:
    """A loss function: ``token_losses(outputs.<field>, mb)`` summed over the valid tokens and
    divided by the mini-batch's token total, reported as ``metric``; ``to`` names it in the
    assertion that the engine passed the field."""

    def loss_fn(
        outputs: ModelOutputs, mb: DataProto, totals: BatchTotals
    ) -> tuple[Any, dict[str, float]]:
        value = getattr(outputs, field)
        if value is None:
            msg = f"the engine passed ModelOutputs without {field} to {to}"
            raise AssertionError(msg)
        mask = mb.batch["response_mask"].to(value.dtype)
        loss = (token_losses(value, mb) * mask).sum() / max(totals.tokens, 1)
        return loss, {metric: float(loss.detach())}

    return loss_fn


# A policy-gradient-shaped token-mean loss over the mini-batch totals, and a critic's.
_loss = _token_mean_loss(
    "log_probs",
    "the loss function",
    "conformance/loss",
    lambda lp, mb: -(lp * mb.batch["advantages"]),
)
_value_loss = _token_mean_loss(
    "values", "a critic's loss function", "conformance/vf_loss", lambda v, mb: (v - 1.0) ** 2
)


def _hf_log_probs(model: Any, batch: DataProto, temperature: float = 1.0) -> Any:
    """Reference log-probs of ``responses`` under softmax(logits / T) of a transformers model."""
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
    logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


class _Recorder:
    """A loss that records what the engine hands it (totals, rows, log-probs)."""

    def __init__(self, *, nan: bool = False) -> None:
        self.totals: list[BatchTotals] = []
        self.rows: list[int] = []
        self.log_probs: list[Any] = []
        self.nan = nan

    def __call__(
        self, outputs: ModelOutputs, mb: DataProto, totals: BatchTotals
    ) -> tuple[Any, dict[str, float]]:
        self.totals.append(totals)
        self.rows.append(len(mb))
        if outputs.log_probs is not None:
            self.log_probs.append(outputs.log_probs.detach().cpu().float())
        loss, metrics = _loss(outputs, mb, totals)
        return (loss * float("nan") if self.nan else loss), metrics


def _expected_totals(batch: DataProto) -> BatchTotals:
    per_row = batch.batch["response_mask"].sum(-1)
    return BatchTotals(
        tokens=int(per_row.sum()),
        sequences=int((per_row > 0).sum()),
        max_response_length=int(batch.batch["response_mask"].shape[1]),
    )


def check_engine(
    cls: type[BaseEngine],
    config: BaseEngine.Config | None = None,
    *,
    model_path: str,
    atol: float = 1e-4,
    critic: bool = False,
) -> None:
    """Check an engine class against :class:`~rlcore.interfaces.BaseEngine` in one process.

    Builds an actor (float32, AdamW, micro-batches of 2 rows) from ``model_path`` (a tiny HF
    causal LM, e.g. :func:`rlcore.testing.tiny_model.build_tiny_model`) inside a 1-rank gloo
    group (created, and destroyed afterwards, when none is initialised). Each rule fails with
    its own message:

    - every abstract method is implemented (``export_hf`` included); ``Config`` is attrs;
    - ``compute_log_prob`` gives finite (B, R) log-probs equal to transformers' within
      ``atol`` at ``temperature`` 1 and 0.7 (softmax(logits / T)), entropy >= 0;
    - a ``ref`` engine (no optimizer) gives the same log-probs;
    - ``forward_backward`` hands ``loss_fn`` the :class:`BatchTotals` of the whole
      mini-batch, micro-batches of at most ``micro_batch_size`` rows covering every row, and
      log-probs at the given temperature; the grad norm does not depend on the micro-batch
      size (normalisation by the totals, not per micro-batch);
    - ``optimizer_step(lr=...)`` applies exactly that ``lr``: ``lr = 0`` changes nothing, the
      first real AdamW step moves parameters by about ``lr``; a NaN loss skips the update and
      returns a non-finite grad norm;
    - ``named_parameters_for_sync`` yields every parameter under its HF name and reproduces
      the engine in ``AutoModelForCausalLM``; ``export_hf`` writes a folder transformers loads
      with the current weights; ``save_checkpoint``/``load_checkpoint`` restore exactly;
    - with ``critic=True`` (an engine that serves the critic role): a ``value_head`` engine's
      ``compute_values`` gives finite (B, R) values, and training on a value loss lowers it.
    """
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    what, config = check_class(cls, BaseEngine, config, "actor.engine")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        fail(
            what,
            "must implement every abstract method of rlcore.interfaces.BaseEngine "
            "(export_hf included: raise NotImplementedError with a reason if it cannot)",
            f"missing {missing}",
        )
    created = False
    if not dist.is_initialized():
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        created = True
    try:
        lr = 1e-2
        spec = EngineSpec(
            role="actor", model_path=model_path, optim=OptimConfig(lr=lr), micro_batch_size=2
        )
        engine = cls(spec, config)
        reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        batch = random_engine_batch(int(reference.config.vocab_size))
        shape = tuple(batch.batch["responses"].shape)
        valid = batch.batch["response_mask"].bool()

        def log_probs(rule: str, on: BaseEngine = engine, temperature: float = 1.0) -> Any:
            out = on.compute_log_prob(batch, temperature=temperature)
            lp = out.log_probs if isinstance(out, ModelOutputs) else None
            if lp is None or tuple(lp.shape) != shape:
                fail(what, rule, f"expected ModelOutputs.log_probs of shape {shape}, got {out!r}")
            if not bool(torch.isfinite(lp).all()) or bool((lp > 1e-6).any()):
                fail(what, rule, "log-probs must be finite and <= 0")
            return lp.detach().cpu().float()

        def close(a: Any, b: Any) -> float:
            return float((a[valid] - b[valid]).abs().max())

        def like_reference(lp: Any, rule: str, differ: str, temperature: float = 1.0) -> None:
            # The engine's log-probs against those of the transformers model ``reference``.
            diff = close(lp, _hf_log_probs(reference, batch, temperature))
            if diff > atol:
                fail(what, rule, f"{differ} {diff:.3g} > atol={atol:g}")

        rule = "compute_log_prob must return (B, R) log-probs of responses"
        before = log_probs(rule)
        like_reference(
            before,
            "compute_log_prob must equal transformers' log-probs of the same model "
            "(left padding, position_ids, responses aligned)",
            "max difference",
        )
        warm = log_probs(rule, temperature=0.7)
        like_reference(
            warm,
            "compute_log_prob(temperature=T) must score softmax(logits / T), the "
            "distribution the rollout sampled (temperature must not be ignored)",
            "at T=0.7 max difference",
            temperature=0.7,
        )
        ent = engine.compute_log_prob(batch, temperature=1.0, with_entropy=True).entropy
        if ent is None or tuple(ent.shape) != shape or not bool((ent >= -1e-6).all()):
            fail(
                what,
                "compute_log_prob(with_entropy=True) must return (B, R) entropy >= 0",
                repr(ent),
            )
        ref = cls(EngineSpec(role="ref", model_path=model_path, micro_batch_size=2), config)
        diff = close(log_probs("a ref engine's compute_log_prob", on=ref), before)
        if diff > atol:
            fail(what, "a ref engine (optim=None) must give the model's log-probs", f"{diff:.3g}")
        del ref

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
        absent = sorted(n for n, _ in reference.named_parameters() if n not in initial)
        if absent:
            fail(
                what,
                "named_parameters_for_sync must yield every parameter",
                f"missing {absent[:5]}",
            )

        # --- normalisation, temperature and lr in a training pass ---------------------------
        recorder = _Recorder()
        metrics = engine.forward_backward(batch, recorder, temperature=0.7)
        if not isinstance(metrics, dict) or not all(
            isinstance(v, float | int) for v in metrics.values()
        ):
            fail(
                what,
                "forward_backward must return a dict of float metrics",
                f"got {metrics!r}",
            )
        expected = _expected_totals(batch)
        wrong = [t for t in recorder.totals if t != expected]
        if wrong:
            fail(
                what,
                "forward_backward must pass loss_fn the BatchTotals of the whole mini-batch "
                "(rlcore.engine_utils.batch_totals), not per-micro-batch counts",
                f"expected {expected}, got {wrong[0]}",
            )
        if sum(recorder.rows) != len(batch) or max(recorder.rows) > 2:
            fail(
                what,
                "forward_backward must split the batch into micro-batches of at most "
                "spec.micro_batch_size rows covering every row",
                f"micro-batch rows {recorder.rows} for {len(batch)} rows, micro_batch_size=2",
            )
        seen = torch.cat(recorder.log_probs)
        diff = close(seen, warm)
        if diff > atol:
            fail(
                what,
                "forward_backward(temperature=T) must give loss_fn log-probs of "
                "softmax(logits / T) (temperature must not be ignored)",
                f"at T=0.7 max difference {diff:.3g} from compute_log_prob",
            )
        split_norm = engine.optimizer_step(lr=0.0)
        moved = [n for n, t in params().items() if not torch.equal(t, initial[n])]
        if moved:
            fail(
                what,
                "optimizer_step(lr=...) must apply exactly the lr it is given (the core's "
                "schedule, rlcore.engine_utils.learning_rate), not its own",
                f"lr=0 changed {moved[:3]}",
            )
        whole = cls(attrs.evolve(spec, micro_batch_size=len(batch)), config)
        whole.forward_backward(batch, _loss, temperature=0.7)
        whole_norm = whole.optimizer_step(lr=0.0)
        del whole
        if not math.isclose(float(split_norm), float(whole_norm), rel_tol=1e-3, abs_tol=1e-6):
            fail(
                what,
                "the gradient of a mini-batch must not depend on its micro-batch split "
                "(divide by the BatchTotals given, sum the micro-batch gradients)",
                f"grad norm {split_norm:.6g} with micro-batches of 2, {whole_norm:.6g} whole",
            )

        rule = "forward_backward + optimizer_step must train the model"
        engine.forward_backward(batch, _loss, temperature=1.0)
        grad_norm = engine.optimizer_step(lr=lr)
        if not isinstance(grad_norm, float | int) or not math.isfinite(float(grad_norm)):
            fail(what, rule, f"optimizer_step must return a finite grad norm, got {grad_norm!r}")
        if float(grad_norm) <= 0.0:
            fail(what, rule, f"grad norm is {grad_norm}: no gradient reached the parameters")
        trained = params()
        step = max(float((trained[n] - initial[n]).abs().max()) for n in initial)
        if step == 0.0:
            fail(what, rule, "no parameter changed after an optimizer step")
        if not 0.5 * lr <= step <= 1.05 * lr:
            fail(
                what,
                "optimizer_step(lr=...) must apply exactly the lr it is given (the core's "
                "schedule, rlcore.engine_utils.learning_rate), not its own",
                f"an AdamW step at lr={lr:g} moved parameters by up to {step:.3g}",
            )
        after = log_probs("compute_log_prob after a step")

        # --- a non-finite loss skips the update ------------------------------------------
        engine.forward_backward(batch, _Recorder(nan=True), temperature=1.0)
        nan_norm = engine.optimizer_step(lr=lr)
        if math.isfinite(float(nan_norm)) or not all(
            torch.equal(t, trained[n]) for n, t in params().items()
        ):
            fail(
                what,
                "a non-finite loss must skip the update and return the non-finite grad norm "
                "(rlcore.engine_utils.clip_and_step)",
                f"grad norm {nan_norm!r}",
            )

        # The synced weights, loaded into a plain transformers model, give the engine's outputs.
        reference.load_state_dict(trained, strict=False)
        like_reference(
            after,
            "weights from named_parameters_for_sync loaded into "
            "AutoModelForCausalLM.from_pretrained(model_path) must reproduce the engine",
            "log-probs differ by",
        )

        with tempfile.TemporaryDirectory(prefix="rlcore-conformance-") as tmp:
            _check_export(what, engine, f"{tmp}/hf", batch, after, close, atol)
            engine.save_checkpoint(f"{tmp}/ckpt")
            engine.forward_backward(batch, _loss, temperature=1.0)
            engine.optimizer_step(lr=lr)
            moved_lp = log_probs("compute_log_prob after a second step")
            engine.load_checkpoint(f"{tmp}/ckpt")
            restored = log_probs("compute_log_prob after load_checkpoint")
        if torch.equal(moved_lp, after):
            fail(what, "a second optimizer step must change the model", "log-probs unchanged")
        if not torch.equal(restored, after):
            diff = float((restored - after).abs().max())
            fail(
                what,
                "load_checkpoint must restore what save_checkpoint saved exactly",
                f"log-probs differ by {diff:.3g}",
            )
        if critic:
            _check_critic(what, cls, config, model_path, batch)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


def _check_critic(
    what: str, cls: type[BaseEngine], config: Any, model_path: str, batch: DataProto
) -> None:
    import torch

    spec = EngineSpec(
        role="critic",
        model_path=model_path,
        optim=OptimConfig(lr=1e-2),
        micro_batch_size=2,
        value_head=True,
    )
    engine = cls(spec, config)
    shape = tuple(batch.batch["responses"].shape)
    try:
        values = engine.compute_values(batch)
    except NotImplementedError as err:
        fail(what, "critic=True: a value_head engine must implement compute_values", str(err))
    if tuple(values.shape) != shape or not bool(torch.isfinite(values).all()):
        fail(what, "compute_values must return finite (B, R) values", repr(values))
    first = engine.forward_backward(batch, _value_loss, temperature=1.0)["conformance/vf_loss"]
    engine.optimizer_step(lr=1e-2)
    for _ in range(3):
        engine.forward_backward(batch, _value_loss, temperature=1.0)
        engine.optimizer_step(lr=1e-2)
    last = engine.forward_backward(batch, _value_loss, temperature=1.0)["conformance/vf_loss"]
    if not last < first:
        fail(
            what,
            "training a value_head engine on a value loss must lower it",
            f"loss {first:.4g} -> {last:.4g}",
        )


def _check_export(
    what: str,
    engine: BaseEngine,
    path: str,
    batch: DataProto,
    current: Any,
    close: Any,
    atol: float,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    rule = (
        "export_hf must write a Hugging Face folder that AutoModelForCausalLM loads, with "
        "the engine's current weights"
    )
    try:
        engine.export_hf(path)
    except NotImplementedError as err:
        fail(what, rule, f"export_hf raised NotImplementedError: {err}")
    try:
        exported = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    except (OSError, ValueError) as err:
        fail(what, rule, f"from_pretrained failed: {err}")
    diff = close(_hf_log_probs(exported, batch), current)
    if diff > atol:
        fail(what, rule, f"log-probs of the exported model differ by {diff:.3g} > atol={atol:g}")
