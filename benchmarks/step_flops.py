"""The model FLOPs of one GRPO step, counted from the model's shape (``benchmarks/vs_trl.py``).

Why: a ratio of step times says how much faster one framework ran, not how much work each
did. Counting each framework's matmul and attention FLOPs for the same step says which part of
a ratio comes from doing less work (rlcore's shared prompts, skipped zero-advantage rows) and
which must come from doing the same work faster: at equal FLOP rates, the time ratio equals the
FLOP ratio, so a time ratio under the FLOP ratio needs faster kernels, not less work.

What is counted, for a decoder-only transformer (2 FLOPs per multiply-add; the shape and its
forward are :class:`rlcore.tracking.flops.ModelShape`, which the runs' ``perf/mfu`` counts with):

- matmuls: every linear layer of every token (q, k, v, o, the MLP's three), and the LM head on
  the tokens whose logits are used (generation: every decoded token; training: the response
  tokens only, as both frameworks compute logits there alone);
- attention: QK^T and PV, 4 x query width x keys per token and layer (causal: a token at
  position t sees t + 1 keys);
- not counted: norms, activations, softmax, rotary embeddings, the optimizer (elementwise, a
  few percent at these sizes), and padding (a lower bound for a framework that pads).

A step is generation (a prefill of each prompt row, or of each distinct prompt when the prefill
is shared, then one decode step per generated position for every row: ``generate`` runs all
rows until the longest is done), the reference forward if there is a KL term, and the training
forward + backward (backward = 2 x forward; gradient checkpointing recomputes the decoder
layers' forward once more). A forward over a group with shared prompts runs the prompt once and
each response against it; skipped (zero-advantage) rows leave the training pass, whole groups
at a time under GRPO.

Checked against ``torch.utils.flop_counter.FlopCounterMode`` on a real model in
``tests/test_vs_trl.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

# One count of a model's FLOPs for the runs' perf/mfu and this benchmark (re-exported here).
from rlcore.tracking.flops import ModelShape, causal_keys

__all__ = ["ModelShape", "StepWork", "causal_keys", "step_flops"]


@dataclass(frozen=True)
class StepWork:
    """One GRPO step as one framework runs it."""

    groups: int  # distinct prompts
    n: int  # samples per prompt
    prompt: float  # mean prompt tokens
    response: float  # mean response tokens
    longest: float  # decode steps: the longest response of the batch
    shared_prefill: bool  # one prefill per distinct prompt
    shared_prompts: bool  # training and reference forwards run each prompt once per group
    trained_share: float = 1.0  # share of groups in the training pass (the rest skipped)
    reference: bool = False  # a KL term: one more forward
    checkpointing: bool = True


def step_flops(shape: ModelShape, work: StepWork) -> dict[str, float]:
    """FLOPs of ``work`` on ``shape``: ``generate``, ``reference``, ``update`` and ``total``."""
    rows = work.groups * work.n
    p, r = work.prompt, work.response
    prefills = work.groups if work.shared_prefill else rows
    prefill = shape.forward(prefills * p, prefills * causal_keys(p), head_tokens=prefills)
    # The prefill's last logits give the first token; each later one takes a forward of the
    # token before it (position p + j - 1, seeing p + j keys).
    steps = max(work.longest - 1, 0.0)
    decode = shape.forward(rows * steps, rows * causal_keys(steps, p), head_tokens=rows * steps)

    def one_pass(groups: float) -> tuple[float, float]:
        """(tokens, keys) of a forward over ``groups`` groups' prompts and responses."""
        if work.shared_prompts:
            tokens = groups * p + groups * work.n * r
            keys = groups * causal_keys(p) + groups * work.n * causal_keys(r, p)
        else:
            tokens = groups * work.n * (p + r)
            keys = groups * work.n * causal_keys(p + r)
        return tokens, keys

    tokens, keys = one_pass(work.groups)
    reference = shape.forward(tokens, keys, rows * r) if work.reference else 0.0
    tokens, keys = one_pass(work.groups * work.trained_share)
    trained_rows = rows * work.trained_share
    update = 3 * shape.forward(tokens, keys, trained_rows * r)
    if work.checkpointing:
        update += shape.decoder_forward(tokens, keys)
    generate = prefill + decode
    return {
        "generate": generate,
        "reference": reference,
        "update": update,
        "total": generate + reference + update,
    }
