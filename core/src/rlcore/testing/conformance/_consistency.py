"""``check_consistency``: a rollout and a training engine on the same weights agree.

The policy gradient assumes the trainer scores the distribution the rollout sampled from; a
rollout whose kernels, precision or weights differ samples from another one (the mismatch
that rollout importance sampling, ``[algorithm] rollout_is``, corrects). This compares the
two full next-token distributions over the vocabulary at every response position, and where
they drift past a bound, finds the first decoder layer whose hidden states part.

Both sides through their optional ``next_token_distributions``
(:meth:`BaseRollout.next_token_distributions`, :meth:`BaseEngine.next_token_distributions`),
so any rollout plugin and any engine can be checked, in one process; the engine must be
built (a 1-rank process group) and the rollout loaded with the engine's weights by the
caller (``rlcore check consistency`` does both, :mod:`rlcore.testing.consistency_check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from rlcore.testing.conformance._common import fail, name_of

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import BaseEngine, BaseRollout
    from rlcore.protocol import DataProto

__all__ = [
    "CONSISTENCY_METRICS",
    "ConsistencyReport",
    "check_consistency",
    "compare_distributions",
    "measure_consistency",
]

# Per-position metrics, trainer's distribution p against the rollout's q.
CONSISTENCY_METRICS: tuple[str, ...] = (
    "kl_trainer_rollout",  # KL(p || q)
    "kl_rollout_trainer",  # KL(q || p)
    "total_variation",  # 0.5 * sum |p - q|
    "top_k_overlap",  # |top-k(p) & top-k(q)| / k
    "log_prob_abs_diff",  # |log p(y) - log q(y)| of the response token y
)
_CHUNK_POSITIONS = 256  # float64 (chunk, V) at a time: 100 MB for a 49k vocabulary


def compare_distributions(
    trainer_logits: torch.Tensor,
    rollout_logits: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    top_k: int = 10,
) -> dict[str, torch.Tensor]:
    """Each metric of :data:`CONSISTENCY_METRICS` at each valid position: (N,) float64.

    ``*_logits``: (B, R, V) logits or log-probs at temperature 1; ``mask`` (B, R): the
    positions compared (``response_mask``); ``labels`` (B, R): the response tokens
    (``log_prob_abs_diff`` is left out without them). Computed in float64, a chunk of
    positions at a time.
    """
    import torch

    if trainer_logits.shape != rollout_logits.shape:
        msg = (
            f"trainer logits {tuple(trainer_logits.shape)} and rollout logits "
            f"{tuple(rollout_logits.shape)} differ in shape (another vocabulary size?)"
        )
        raise ValueError(msg)
    valid = mask.bool()
    p_all, q_all = trainer_logits[valid], rollout_logits[valid]  # (N, V)
    y_all = labels[valid] if labels is not None else None
    k = min(top_k, p_all.shape[-1])
    parts: dict[str, list[torch.Tensor]] = {m: [] for m in CONSISTENCY_METRICS}
    for start in range(0, p_all.shape[0], _CHUNK_POSITIONS):
        stop = start + _CHUNK_POSITIONS
        logp = torch.log_softmax(p_all[start:stop].double(), -1)
        logq = torch.log_softmax(q_all[start:stop].double(), -1)
        p, q = logp.exp(), logq.exp()
        parts["kl_trainer_rollout"].append((p * (logp - logq)).sum(-1).clamp(min=0))
        parts["kl_rollout_trainer"].append((q * (logq - logp)).sum(-1).clamp(min=0))
        parts["total_variation"].append(0.5 * (p - q).abs().sum(-1))
        top_p, top_q = logp.topk(k, -1).indices, logq.topk(k, -1).indices
        shared = (top_p.unsqueeze(-1) == top_q.unsqueeze(-2)).any(-1).sum(-1)
        parts["top_k_overlap"].append(shared.double() / k)
        if y_all is not None:
            y = y_all[start:stop].unsqueeze(-1)
            diff = (logp.gather(-1, y) - logq.gather(-1, y)).abs().squeeze(-1)
            parts["log_prob_abs_diff"].append(diff)
    if y_all is None:
        del parts["log_prob_abs_diff"]
    return {m: torch.cat(v) if v else torch.zeros(0, dtype=torch.float64) for m, v in parts.items()}


def _layer_errors(trainer: list[Any], rollout: list[Any], mask: Any) -> list[float]:
    """Per layer: the largest relative difference ``|h_q - h_p| / |h_p|`` over positions."""
    valid = mask.bool()
    out = []
    for hp, hq in zip(trainer, rollout):
        a, b = hp[valid].double(), hq[valid].double()
        rel = (b - a).norm(dim=-1) / a.norm(dim=-1).clamp(min=1e-12)
        out.append(float(rel.max()) if rel.numel() else 0.0)
    return out


@attrs.frozen(kw_only=True)
class ConsistencyReport:
    """What :func:`measure_consistency` found.

    ``metrics``: name -> (mean, max) over the valid response positions (``top_k_overlap``:
    (mean, min), the worst is the smallest). ``layer_errors``: per decoder layer, the largest
    relative hidden-state difference, when the distributions drifted and both sides returned
    hidden states; ``first_layer``: the first of them past ``layer_bound`` (0-based), None
    if none is or they were not compared (``layers_note`` says why).
    """

    rollout: str
    engine: str
    positions: int
    metrics: dict[str, tuple[float, float]]
    kl_bound: float
    layer_bound: float
    layer_errors: list[float] | None = None
    first_layer: int | None = None
    layers_note: str = ""

    @property
    def worst_kl(self) -> float:
        """The largest per-position KL, either direction: what the bound applies to."""
        return max(self.metrics["kl_trainer_rollout"][1], self.metrics["kl_rollout_trainer"][1])

    @property
    def passed(self) -> bool:
        return self.worst_kl <= self.kl_bound

    def table(self) -> str:
        """The report as a plain-text table (metric, mean, max or min)."""
        rows = [("metric", "mean", "max")]
        for name, (mean, worst) in self.metrics.items():
            suffix = " (min)" if name == "top_k_overlap" else ""
            rows.append((name, f"{mean:.3e}", f"{worst:.3e}{suffix}"))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"{self.rollout} vs {self.engine}: {self.positions} response positions"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        verdict = "ok" if self.passed else "DRIFT"
        lines.append(f"{verdict}: worst KL {self.worst_kl:.3e} (bound {self.kl_bound:g})")
        if self.layer_errors is not None:
            errs = ", ".join(f"{e:.2e}" for e in self.layer_errors)
            where = "none" if self.first_layer is None else str(self.first_layer)
            lines.append(
                f"first layer past {self.layer_bound:g} relative difference: {where} "
                f"(per layer: {errs})"
            )
        elif self.layers_note:
            lines.append(f"layers: {self.layers_note}")
        return "\n".join(lines)


def measure_consistency(
    rollout: BaseRollout,
    engine: BaseEngine,
    batch: DataProto,
    *,
    kl_bound: float = 1e-3,
    layer_bound: float = 1e-2,
    top_k: int = 10,
) -> ConsistencyReport:
    """Compare ``rollout`` and ``engine`` on ``batch`` (a ``generate`` output: ``input_ids``,
    ``attention_mask``, ``position_ids``, ``responses``, ``response_mask``).

    Both must hold the same weights (the caller syncs them). Drift is the largest
    per-position KL in either direction past ``kl_bound``; then the hidden states of both are
    compared layer by layer and the first layer past ``layer_bound`` relative difference is
    named. A side without ``next_token_distributions`` raises its NotImplementedError (one
    line naming the plugin).
    """
    r_what, e_what = name_of(type(rollout)), name_of(type(engine))
    mask = batch.batch["response_mask"]
    labels = batch.batch["responses"]
    on_trainer = engine.next_token_distributions(batch)
    on_rollout = rollout.next_token_distributions(batch)
    values = compare_distributions(on_trainer.logits, on_rollout.logits, mask, labels, top_k=top_k)
    del on_trainer, on_rollout
    metrics = {}
    for name, v in values.items():
        if v.numel() == 0:
            metrics[name] = (0.0, 0.0)
            continue
        worst = float(v.min()) if name == "top_k_overlap" else float(v.max())
        metrics[name] = (float(v.mean()), worst)
    report = ConsistencyReport(
        rollout=r_what,
        engine=e_what,
        positions=int(mask.bool().sum()),
        metrics=metrics,
        kl_bound=kl_bound,
        layer_bound=layer_bound,
    )
    if report.passed:
        return report
    return _localise(report, rollout, engine, batch)


def _localise(
    report: ConsistencyReport, rollout: BaseRollout, engine: BaseEngine, batch: DataProto
) -> ConsistencyReport:
    """``report`` with the per-layer hidden-state differences, or a note why there are none."""
    h_trainer = engine.next_token_distributions(batch, hidden_states=True).hidden_states
    h_rollout = rollout.next_token_distributions(batch, hidden_states=True).hidden_states
    missing = [w for w, h in ((report.engine, h_trainer), (report.rollout, h_rollout)) if not h]
    if missing or h_trainer is None or h_rollout is None:
        note = f"{' and '.join(missing)} returned no hidden states: the layer is not located"
        return attrs.evolve(report, layers_note=note)
    if len(h_trainer) != len(h_rollout):
        note = f"{len(h_trainer)} trainer layers against {len(h_rollout)} rollout layers"
        return attrs.evolve(report, layers_note=note)
    errors = _layer_errors(h_trainer, h_rollout, batch.batch["response_mask"])
    first = next((i for i, e in enumerate(errors) if e > report.layer_bound), None)
    return attrs.evolve(report, layer_errors=errors, first_layer=first)


def check_consistency(
    rollout: BaseRollout,
    engine: BaseEngine,
    batch: DataProto,
    *,
    kl_bound: float = 1e-3,
    layer_bound: float = 1e-2,
    top_k: int = 10,
) -> ConsistencyReport:
    """:func:`measure_consistency`, failing (AssertionError, the table in the message) when
    the distributions drift past ``kl_bound`` or a side cannot return them; returns the
    report otherwise."""
    try:
        report = measure_consistency(
            rollout, engine, batch, kl_bound=kl_bound, layer_bound=layer_bound, top_k=top_k
        )
    except NotImplementedError as err:
        pair = f"{name_of(type(rollout))} vs {name_of(type(engine))}"
        fail(pair, "both sides need next_token_distributions", str(err))
    if not report.passed:
        fail(
            report.rollout,
            f"the rollout's next-token distributions must match the engine's "
            f"({report.engine}) on the same weights within KL {kl_bound:g}",
            "\n" + report.table(),
        )
    return report
