"""``check_harness`` and ``check_rollout_endpoint``: token-faithful agents behind the endpoint.

Both run the real endpoint (:mod:`rlcore.agent.endpoint`) over a rollout the author
builds, and hold the samples to the ★ rule of issue 46: what is trained is what was sampled,
token for token, with the loss on the model's tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from rlcore.interfaces import BaseHarness, BaseRollout, SamplingParams
from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_class

__all__ = ["HarnessReport", "check_harness", "check_rollout_endpoint"]


@attrs.frozen(kw_only=True)
class HarnessReport:
    """What :func:`check_harness` measured: samples, splits, re-tokenisation mismatches."""

    rows: int
    samples: int
    splits: int
    retokenize_mismatch: int
    calls: float


def _template_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def check_harness(
    cls: type[BaseHarness],
    rollout: BaseRollout,
    tokenizer: Any,
    prompts: Sequence[Sequence[dict[str, Any]]],
    config: BaseHarness.Config | None = None,
    *,
    max_new_tokens: int = 64,
    isolation: str = "thread",
    timeout_s: float = 60.0,
    allow_splits: bool = False,
    allow_mismatch: bool = False,
) -> HarnessReport:
    """Run harness ``cls`` on each chat ``prompts`` row through the endpoint over ``rollout``.

    Rules: the ``Config`` rules; every run returns (no failure: hang, crash, empty result,
    flood) and makes at least one call; each assembled row is the recorded calls' tokens with
    the loss mask exactly on the completion tokens (:func:`rlcore.agent.trajectory.check_row`);
    no split (a later prompt that does not extend the previous call) unless ``allow_splits``;
    no re-tokenisation mismatch unless ``allow_mismatch``. Returns the counts.
    """
    import numpy as np
    import torch

    from rlcore.agent.harness import HarnessLoop
    from rlcore.agent.trajectory import check_row
    from rlcore.config import AgentConfig
    from rlcore.plugins import Component
    from rlcore.protocol import DataProto

    what, config = check_class(cls, BaseHarness, config, "agent.options")
    agent = AgentConfig(
        harness="conformance", harness_isolation=isolation, harness_timeout_s=timeout_s
    )
    comp = Component(kind="harness", name="conformance", options=config, target=cls)
    loop = HarnessLoop(tokenizer, comp, agent)
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [list(p) for p in prompts]
    ids = [_template_ids(tokenizer, list(p)) for p in prompts]
    width = max(len(i) for i in ids)
    input_ids = torch.full((len(ids), width), int(loop.pad_token_id))
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for r, row in enumerate(ids):
        input_ids[r, width - len(row) :] = torch.tensor(row)
        mask[r, width - len(row) :] = 1
    batch = DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={"raw_prompt": raw},
    )
    sampling = SamplingParams(max_new_tokens=max_new_tokens, return_log_probs=True)
    try:
        out = loop.generate(rollout, batch, sampling)
    finally:
        if loop.server is not None:
            loop.server.stop()
    metrics = {k: v[0] for k, v in out.meta_info["metrics"].items()}
    for summary in out.non_tensor_batch["agent"]:
        if summary["harness_failure"] is not None:
            fail(
                what,
                "run must return an answer within the bounds",
                f"it failed: {summary['harness_failure']}",
            )
    R = max_new_tokens
    for b, seg in enumerate(loop.last_samples):
        if seg is None:
            fail(what, "run must call the endpoint at least once", f"row {b} made no call")
        n = int(out.batch["attention_mask"][b, -R:].sum())
        prompt = out.batch["prompts"][b][out.batch["attention_mask"][b, :-R].bool()].tolist()
        why = check_row(
            seg,
            out.batch["responses"][b, :n].tolist(),
            out.batch["response_mask"][b, :n].tolist(),
            prompt,
        )
        if why is not None and n < R:  # a row cut at R holds a prefix: checked as far as it goes
            fail(
                what, "a row must be the recorded tokens, the loss on the model's tokens only", why
            )
    report = HarnessReport(
        rows=len(prompts),
        samples=len(out),
        splits=int(metrics["agent/splits"]),
        retokenize_mismatch=int(metrics["agent/retokenize_mismatch"]),
        calls=float(metrics["agent/calls"]),
    )
    if report.splits and not allow_splits:
        fail(
            what,
            "each call's prompt must extend the previous call's tokens (no split)",
            f"{report}",
        )
    if report.retokenize_mismatch and not allow_mismatch:
        fail(what, "the recorded tokens must re-tokenise to the same ids", f"{report}")
    return report


def check_rollout_endpoint(
    rollout: BaseRollout, tokenizer: Any, *, max_new_tokens: int = 8
) -> None:
    """A rollout serves the endpoint: a chat call's recorded prompt is the chat template's
    ids, the completion decodes to the text returned, has one log-prob per token (finite,
    <= 0) and at most ``max_tokens`` tokens, and a token-id prompt (``/v1/completions``) is
    used as given."""
    import math

    import openai

    from rlcore.agent.endpoint import EndpointServer

    what = type(rollout).__name__
    server = EndpointServer(rollout, tokenizer).start()
    try:
        sampling = SamplingParams(max_new_tokens=64, return_log_probs=True)
        sid = server.open_session(sampling, budget=64)
        client = openai.OpenAI(base_url=server.base_url(sid), api_key=server.api_key, max_retries=0)
        messages: Any = [{"role": "user", "content": "Say hi."}]
        out = client.chat.completions.create(
            model="policy", messages=messages, max_tokens=max_new_tokens
        )
        client.completions.create(model="policy", prompt=[5, 6, 7], max_tokens=max_new_tokens)
        chat, raw = server.close_session(sid).calls
    finally:
        server.stop()
    expected = _template_ids(tokenizer, messages)
    if chat.prompt_ids != list(expected):
        fail(what, "the chat call's prompt must be the template's ids", f"{chat.prompt_ids[:8]}...")
    if not 1 <= len(chat.completion_ids) <= max_new_tokens:
        fail(what, "a completion must have 1..max_tokens tokens", f"{len(chat.completion_ids)}")
    if (
        tokenizer.decode(chat.completion_ids, skip_special_tokens=True)
        != out.choices[0].message.content
    ):
        fail(what, "the completion must decode to the text returned", "it differs")
    lps = chat.log_probs
    if (
        lps is None
        or len(lps) != len(chat.completion_ids)
        or not all(math.isfinite(x) and x <= 1e-6 for x in lps)
    ):
        fail(what, "generate_one must return one finite log-prob <= 0 per token", f"{lps}")
    if raw.prompt_ids != [5, 6, 7]:
        fail(what, "a token-id prompt must be used as given", f"{raw.prompt_ids}")
