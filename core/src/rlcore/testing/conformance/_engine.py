"""``check_engine``: an actor engine trains, syncs HF-named weights and checkpoints exactly."""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from rlcore.engine.rollout_layout import position_ids_from_mask
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
            "position_ids": position_ids_from_mask(attn),
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


class _Findings:
    """Every broken rule of one check, collected so that one failure does not hide the rest.

    ``with findings.rule():`` runs a block of rules; an :class:`AssertionError` from
    :func:`fail` (or any exception of the plugin's code, named) is recorded and the check goes
    on with the next block. :meth:`raise_all` raises one AssertionError listing them all (the
    single line itself when only one rule broke).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.messages: list[str] = []

    @contextlib.contextmanager
    def rule(self, label: str) -> Iterator[None]:
        try:
            yield
        except AssertionError as err:
            self.messages.append(str(err))
        except Exception as err:  # plugin code raised: a finding too, named by the block
            self.messages.append(f"{self.what}: {label} raised {type(err).__name__}: {err}")

    def raise_all(self) -> None:
        if len(self.messages) == 1:
            raise AssertionError(self.messages[0])
        if self.messages:
            listed = "\n".join(f"  - {m}" for m in self.messages)
            msg = f"{self.what}: {len(self.messages)} rules broken:\n{listed}"
            raise AssertionError(msg)


def check_engine(
    cls: type[BaseEngine],
    config: BaseEngine.Config | None = None,
    *,
    model_path: str,
    atol: float = 1e-4,
    critic: bool = False,
) -> None:
    """Check an engine class against :class:`~rlcore.interfaces.BaseEngine` in one process.

    Builds actors (float32, micro-batches of 2 rows, whatever optimizer the engine uses:
    AdamW, SGD, ...) from ``model_path`` (a tiny HF causal LM, e.g.
    :func:`rlcore.testing.tiny_model.build_tiny_model`) inside a 1-rank gloo group (created,
    and destroyed afterwards, when none is initialised). Every rule is checked even when an
    earlier one broke; the AssertionError lists each broken rule on its own line
    (``<class>: <rule>: <what was seen>``):

    - every abstract method is implemented (``export_hf`` included); ``Config`` is attrs
      (these two stop the check: nothing else can run);
    - ``compute_log_prob`` gives finite (B, R) log-probs equal to transformers' within
      ``atol`` at ``temperature`` 1 and 0.7 (softmax(logits / T)), and at temperature 0
      (greedy sampling) those of temperature 1; entropy >= 0;
    - a ``ref`` engine (no optimizer) gives the same log-probs;
    - ``forward_backward`` hands ``loss_fn`` the :class:`BatchTotals` of the whole
      mini-batch, micro-batches of at most ``micro_batch_size`` rows covering every row, and
      log-probs at the given temperature; the grad norm does not depend on the micro-batch
      size (normalisation by the totals, not per micro-batch);
    - ``optimizer_step(lr=...)`` applies exactly that ``lr``: ``lr = 0`` changes nothing, and
      from the same state and gradient a step at ``2 lr`` moves the parameters twice as far as
      one at ``lr`` (true of SGD, momentum and Adam-family first steps alike; an engine with
      its own schedule breaks it); a step trains (finite, positive grad norm, parameters
      move); a NaN loss skips the update and returns a non-finite grad norm;
    - ``named_parameters_for_sync`` yields every parameter under its HF name and reproduces
      the engine in ``AutoModelForCausalLM``; ``export_hf`` writes a folder transformers loads
      with the current weights; ``save_checkpoint``/``load_checkpoint`` restore exactly;
    - with ``critic=True`` (an engine that serves the critic role): a ``value_head`` engine's
      ``compute_values`` gives finite (B, R) values, and training on a value loss lowers it.
    """
    import torch.distributed as dist

    what, config = check_class(cls, BaseEngine, config, "actor.engine")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        fail(
            what,
            "must implement every abstract method of rlcore.interfaces.BaseEngine "
            "(export_hf included: raise NotImplementedError with a reason if it cannot)",
            f"missing {missing}",
        )
    findings = _Findings(what)
    created = False
    if not dist.is_initialized():
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        created = True
    try:
        _engine_rules(cls, config, what, model_path, atol, findings)
        if critic:
            with findings.rule("the critic rules"):
                _check_critic(
                    what, cls, config, model_path, random_engine_batch(_vocab(model_path))
                )
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
    findings.raise_all()


def _vocab(model_path: str) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).vocab_size)


def _engine_rules(
    cls: type[BaseEngine],
    config: Any,
    what: str,
    model_path: str,
    atol: float,
    findings: _Findings,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    lr = 1e-2
    spec = EngineSpec(
        role="actor", model_path=model_path, optim=OptimConfig(lr=lr), micro_batch_size=2
    )
    try:
        engine = cls(spec, config)
    except Exception as err:  # the constructor is plugin code; nothing else can run
        fail(what, "cls(spec, config) must build an actor engine", f"{type(err).__name__}: {err}")
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
            fail(what, rule, f"log-probs must be finite and <= 0 (temperature {temperature:g})")
        return lp.detach().cpu().float()

    def close(a: Any, b: Any) -> float:
        return float((a[valid] - b[valid]).abs().max())

    def like_reference(lp: Any, rule: str, differ: str, temperature: float = 1.0) -> None:
        # The engine's log-probs against those of the transformers model ``reference``.
        diff = close(lp, _hf_log_probs(reference, batch, temperature))
        if diff > atol:
            fail(what, rule, f"{differ} {diff:.3g} > atol={atol:g}")

    def params(on: BaseEngine = engine) -> dict[str, torch.Tensor]:
        return {n: t.detach().cpu().float().clone() for n, t in on.named_parameters_for_sync()}

    lr_rule = (
        "optimizer_step(lr=...) must apply exactly the lr it is given (the core's "
        "schedule, rlcore.engine.learning_rate), not its own"
    )
    rule = "compute_log_prob must return (B, R) log-probs of responses"
    before = warm = None
    with findings.rule("compute_log_prob"):
        before = log_probs(rule)
        like_reference(
            before,
            "compute_log_prob must equal transformers' log-probs of the same model "
            "(left padding, position_ids, responses aligned)",
            "max difference",
        )
    with findings.rule("compute_log_prob(temperature=0.7)"):
        warm = log_probs(rule, temperature=0.7)
        like_reference(
            warm,
            "compute_log_prob(temperature=T) must score softmax(logits / T), the "
            "distribution the rollout sampled (temperature must not be ignored)",
            "at T=0.7 max difference",
            temperature=0.7,
        )
    with findings.rule("compute_log_prob(temperature=0)"):
        greedy = log_probs(
            "compute_log_prob(temperature=0) must score the unscaled logits (greedy sampling)",
            temperature=0.0,
        )
        like_reference(
            greedy,
            "compute_log_prob(temperature=0) must equal temperature 1 (greedy sampling scores "
            "the unscaled logits: divide by T only when T is not 0)",
            "at T=0 max difference",
        )
    with findings.rule("compute_log_prob(with_entropy=True)"):
        ent = engine.compute_log_prob(batch, temperature=1.0, with_entropy=True).entropy
        if ent is None or tuple(ent.shape) != shape or not bool((ent >= -1e-6).all()):
            fail(
                what,
                "compute_log_prob(with_entropy=True) must return (B, R) entropy >= 0",
                repr(ent),
            )
    with findings.rule("a ref engine"):
        ref = cls(EngineSpec(role="ref", model_path=model_path, micro_batch_size=2), config)
        ref_lp = log_probs("a ref engine's compute_log_prob", on=ref)
        del ref
        if before is not None and (diff := close(ref_lp, before)) > atol:
            fail(what, "a ref engine (optim=None) must give the model's log-probs", f"{diff:.3g}")

    initial = params()
    with findings.rule("named_parameters_for_sync"):
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

    # --- normalisation, temperature and lr in a training pass -------------------------------
    split_norm = None
    with findings.rule("forward_backward"):
        recorder = _Recorder()
        metrics = engine.forward_backward(batch, recorder, temperature=0.7)
        if not isinstance(metrics, dict) or not all(
            isinstance(v, float | int) for v in metrics.values()
        ):
            fail(what, "forward_backward must return a dict of float metrics", f"got {metrics!r}")
        expected = _expected_totals(batch)
        wrong = [t for t in recorder.totals if t != expected]
        if wrong:
            fail(
                what,
                "forward_backward must pass loss_fn the BatchTotals of the whole mini-batch "
                "(rlcore.engine.batch_totals), not per-micro-batch counts",
                f"expected {expected}, got {wrong[0]}",
            )
        if sum(recorder.rows) != len(batch) or max(recorder.rows) > 2:
            fail(
                what,
                "forward_backward must split the batch into micro-batches of at most "
                "spec.micro_batch_size rows covering every row",
                f"micro-batch rows {recorder.rows} for {len(batch)} rows, micro_batch_size=2",
            )
        if warm is not None and (diff := close(torch.cat(recorder.log_probs), warm)) > atol:
            fail(
                what,
                "forward_backward(temperature=T) must give loss_fn log-probs of "
                "softmax(logits / T) (temperature must not be ignored)",
                f"at T=0.7 max difference {diff:.3g} from compute_log_prob",
            )
    with findings.rule("optimizer_step(lr=0)"):
        split_norm = engine.optimizer_step(lr=0.0)
        moved = [n for n, t in params().items() if not torch.equal(t, initial[n])]
        if moved:
            fail(what, lr_rule, f"lr=0 changed {moved[:3]}")
    with findings.rule("the micro-batch split"):
        whole = cls(attrs.evolve(spec, micro_batch_size=len(batch)), config)
        whole.forward_backward(batch, _loss, temperature=0.7)
        whole_norm = whole.optimizer_step(lr=0.0)
        del whole
        if split_norm is not None and not math.isclose(
            float(split_norm), float(whole_norm), rel_tol=1e-3, abs_tol=1e-6
        ):
            fail(
                what,
                "the gradient of a mini-batch must not depend on its micro-batch split "
                "(divide by the BatchTotals given, sum the micro-batch gradients)",
                f"grad norm {split_norm:.6g} with micro-batches of 2, {whole_norm:.6g} whole",
            )
    with findings.rule("optimizer_step(lr) against optimizer_step(2 lr)"):
        _check_lr_scaling(cls, config, spec, batch, lr, what, lr_rule, params)

    trained = after = None
    with findings.rule("forward_backward + optimizer_step"):
        rule = "forward_backward + optimizer_step must train the model"
        engine.forward_backward(batch, _loss, temperature=1.0)
        grad_norm = engine.optimizer_step(lr=lr)
        if not isinstance(grad_norm, float | int) or not math.isfinite(float(grad_norm)):
            fail(what, rule, f"optimizer_step must return a finite grad norm, got {grad_norm!r}")
        if float(grad_norm) <= 0.0:
            fail(what, rule, f"grad norm is {grad_norm}: no gradient reached the parameters")
        trained = params()
        if all(torch.equal(trained[n], initial[n]) for n in initial):
            fail(what, rule, "no parameter changed after an optimizer step")
        after = log_probs("compute_log_prob after a step")

    # --- a non-finite loss skips the update ------------------------------------------------
    with findings.rule("a NaN loss"):
        now = params()
        engine.forward_backward(batch, _Recorder(nan=True), temperature=1.0)
        nan_norm = engine.optimizer_step(lr=lr)
        if math.isfinite(float(nan_norm)) or not all(
            torch.equal(t, now[n]) for n, t in params().items()
        ):
            fail(
                what,
                "a non-finite loss must skip the update and return the non-finite grad norm "
                "(rlcore.engine.clip_and_step)",
                f"grad norm {nan_norm!r}",
            )

    if trained is None or after is None:
        return  # the engine did not train: the weight and checkpoint rules have nothing to see
    # The synced weights, loaded into a plain transformers model, give the engine's outputs.
    with findings.rule("named_parameters_for_sync after a step"):
        reference.load_state_dict(trained, strict=False)
        like_reference(
            after,
            "weights from named_parameters_for_sync loaded into "
            "AutoModelForCausalLM.from_pretrained(model_path) must reproduce the engine",
            "log-probs differ by",
        )
    with tempfile.TemporaryDirectory(prefix="rlcore-conformance-") as tmp:
        with findings.rule("export_hf"):
            _check_export(what, engine, f"{tmp}/hf", batch, after, close, atol)
        with findings.rule("save_checkpoint/load_checkpoint"):
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


def _check_lr_scaling(
    cls: type[BaseEngine],
    config: Any,
    spec: EngineSpec,
    batch: DataProto,
    lr: float,
    what: str,
    rule: str,
    params: Callable[[BaseEngine], dict[str, Any]],
) -> None:
    """Two fresh engines, the same gradient, one step at ``lr`` and one at ``2 lr``: the
    second moves the parameters twice as far (whatever the optimizer's update direction)."""
    import torch

    moves = []
    for step_lr in (lr, 2 * lr):
        fresh = cls(spec, config)
        start = params(fresh)
        fresh.forward_backward(batch, _loss, temperature=1.0)
        fresh.optimizer_step(lr=step_lr)
        end = params(fresh)
        moves.append(torch.cat([(end[n] - start[n]).flatten() for n in start]))
        del fresh
    one, two = moves
    size = float(one.norm())
    if size == 0.0:
        fail(what, rule, f"a step at lr={lr:g} moved no parameter")
    off = float((two - 2 * one).norm()) / size
    if off > 0.02:
        fail(
            what,
            rule,
            f"a step at lr={2 * lr:g} moved parameters {float(two.norm()) / size:.3g}x as far "
            f"as one at lr={lr:g} (expected 2x; relative difference {off:.3g})",
        )


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
