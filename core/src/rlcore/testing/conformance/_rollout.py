"""``check_rollout``: the generate layout, masks and positions, seeding and weight updates."""

from __future__ import annotations

import contextlib
from typing import Any

from rlcore.interfaces import BaseRollout, RolloutSpec, RolloutTraits, SamplingParams
from rlcore.protocol import DataProto
from rlcore.rl.step import expand_prompts
from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_class
from rlcore.testing.prompts import prompt_batch

__all__ = ["check_rollout"]

_TEXTS = ("Hi", "What is 2+3?", "abc def", "Say a long sentence, please.")
_R = 8  # max_new_tokens


def _prompts(model_path: str) -> DataProto:
    from transformers import AutoTokenizer

    return prompt_batch(AutoTokenizer.from_pretrained(model_path), _TEXTS)


def _eos_ids(model_path: str) -> set[int]:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    ids: set[int] = set()
    values: list[Any] = [AutoConfig.from_pretrained(model_path).eos_token_id]
    with contextlib.suppress(OSError):  # a folder without generation_config.json
        values.append(GenerationConfig.from_pretrained(model_path).eos_token_id)
    values.append(AutoTokenizer.from_pretrained(model_path).eos_token_id)
    for v in values:
        ids.update([v] if isinstance(v, int) else list(v or []))
    return ids


def _check_layout(what: str, out: Any, prompts: DataProto, n: int, eos: set[int]) -> None:
    """``prompts`` are the unique prompts; ``generate`` got each repeated ``n`` times."""
    import torch

    rule = "generate must return exactly one response per input row, in input order"
    if not isinstance(out, DataProto):
        fail(what, rule, f"returned {type(out).__name__}, not a DataProto")
    b = out.batch
    rows = len(prompts) * n
    keys = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")
    missing = [k for k in keys if k not in b]
    if missing:
        fail(what, "generate must return the documented tensors", f"missing {missing}")
    p_ids = prompts.batch["input_ids"].repeat_interleave(n, 0)
    p_mask = prompts.batch["attention_mask"].repeat_interleave(n, 0)
    p_pos = prompts.batch["position_ids"].repeat_interleave(n, 0)
    p = p_ids.shape[1]
    if len(out) != rows or not torch.equal(b["prompts"].cpu(), p_ids):
        fail(what, rule, f"{len(out)} rows; prompts equal the interleaved input: False")
    resp, rmask = b["responses"].cpu(), b["response_mask"].cpu()
    for key, t in (("responses", resp), ("response_mask", rmask)):
        if tuple(t.shape) != (rows, _R):
            fail(
                what,
                "responses are right-padded to exactly max_new_tokens",
                f"{key} has shape {tuple(t.shape)}, expected {(rows, _R)}",
            )
    is_eos = torch.isin(resp, torch.tensor(sorted(eos), dtype=resp.dtype))
    eos_before = torch.cumsum(is_eos.long(), 1) - is_eos.long()
    expected = (eos_before == 0).long()
    if not torch.equal(rmask.long(), expected):
        row = int((rmask.long() != expected).any(1).nonzero()[0])
        fail(
            what,
            "response_mask must be 1 up to and including the first EOS and 0 after",
            f"row {row}: responses {resp[row].tolist()}, mask {rmask[row].tolist()}",
        )
    if not torch.equal(b["input_ids"].cpu(), torch.cat([p_ids, resp], 1)):
        fail(what, "input_ids must be cat(prompts, responses)", "they differ")
    attn = torch.cat([p_mask, rmask.to(p_mask.dtype)], 1)
    if not torch.equal(b["attention_mask"].cpu().long(), attn.long()):
        fail(
            what, "attention_mask must be cat(prompt attention_mask, response_mask)", "they differ"
        )
    pos = b["position_ids"].cpu()
    want = p_pos[:, -1:] + torch.arange(1, _R + 1).unsqueeze(0)
    if tuple(pos.shape) != (rows, p + _R) or not torch.equal(pos[:, :p], p_pos):
        fail(what, "position_ids must keep the prompt's positions", f"shape {tuple(pos.shape)}")
    valid = rmask.bool()
    if not torch.equal(pos[:, p:][valid], want[valid]):
        fail(
            what, "response position_ids must continue from the last prompt position", "they do not"
        )


def _check_log_probs(
    what: str, rollout: BaseRollout, rows: DataProto, model_path: str, eos: set[int]
) -> None:
    """``rollout_log_probs`` at T = 0.7 are those of softmax(logits / 0.7) of the model."""
    import torch
    from transformers import AutoModelForCausalLM

    sampling = SamplingParams(temperature=0.7, max_new_tokens=_R, return_log_probs=True)
    out = rollout.generate(rows, sampling)
    b = out.batch
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"].cpu(),
            attention_mask=b["attention_mask"].cpu(),
            position_ids=b["position_ids"].cpu(),
        ).logits[:, -_R - 1 : -1]
    logp = torch.log_softmax(logits.float() / 0.7, -1)
    expected = logp.gather(-1, b["responses"].cpu().unsqueeze(-1)).squeeze(-1)
    mask = b["response_mask"].cpu().bool()
    got = b["rollout_log_probs"].cpu().float()
    diff = float((got[mask] - expected[mask]).abs().max())
    if diff > 1e-3:
        fail(
            what,
            "rollout_log_probs must be log softmax(logits / temperature) of the sampled tokens "
            "(temperature must not be ignored)",
            f"at T=0.7 max difference {diff:.3g} from the model's",
        )


def check_rollout(
    cls: type[BaseRollout],
    config: BaseRollout.Config | None = None,
    *,
    model_path: str,
    seed: int = 0,
) -> None:
    """Check a rollout class against :class:`~rlcore.interfaces.BaseRollout`.

    Builds it from ``model_path`` (a tiny HF causal LM with a tokenizer) with
    ``max_new_tokens = 8`` and checks: one response per input row, in order (prompts repeated
    as the driver repeats them),
    shapes, ``response_mask`` (ones up to and including EOS), ``input_ids``/``attention_mask``/
    ``position_ids`` built from prompt and response, ``rollout_log_probs`` when asked (those of
    softmax(logits / T) at T = 0.7); greedy
    generation is deterministic and identical across the ``n`` samples; sampled ``n`` samples
    are not all identical; ``state_dict``/``load_state_dict`` reproduce the next sampled
    batch; ``update_weights`` with other weights changes greedy outputs, and the original
    weights bring them back.
    """
    import torch
    from transformers import AutoModelForCausalLM

    what, config = check_class(cls, BaseRollout, config, "rollout")
    traits = cls.traits(config)
    if not isinstance(traits, RolloutTraits):
        fail(what, "traits(config) must return an rlcore.interfaces.RolloutTraits", repr(traits))
    spec = RolloutSpec(
        model_path=model_path, max_prompt_length=64, max_response_length=_R, seed=seed
    )
    rollout = cls(spec, config)
    prompts = _prompts(model_path)
    eos = _eos_ids(model_path)

    sample = SamplingParams(temperature=1.0, max_new_tokens=_R, return_log_probs=True)
    state = rollout.state_dict()
    rows3 = expand_prompts(prompts, 3)  # the driver's expansion: n = 3
    first = rollout.generate(rows3, sample)
    _check_layout(what, first, prompts, 3, eos)
    lp = first.batch.get("rollout_log_probs")
    mask = first.batch["response_mask"].cpu().bool()
    if lp is None or tuple(lp.shape) != tuple(mask.shape):
        fail(what, "return_log_probs=True must add rollout_log_probs (B, R)", repr(lp))
    lp = lp.cpu()
    if not bool(torch.isfinite(lp[mask]).all()) or bool((lp[mask] > 1e-5).any()):
        fail(what, "rollout_log_probs must be finite and <= 0 on response tokens", "they are not")
    _check_log_probs(what, rollout, rows3, model_path, eos)
    groups = first.batch["responses"].cpu().view(len(prompts), 3, _R)
    if all(bool((g == g[0]).all()) for g in groups):
        fail(
            what,
            "rows with the same prompt must be sampled independently",
            "all identical",
        )

    if not isinstance(state, dict):
        fail(what, "state_dict must return a dict", repr(state))
    rollout.load_state_dict(state)
    again = rollout.generate(rows3, sample)
    if not torch.equal(again.batch["responses"], first.batch["responses"]):
        fail(
            what,
            "load_state_dict(state_dict()) must reproduce the next sampled batch (resume)",
            "responses differ",
        )

    greedy = SamplingParams(do_sample=False, max_new_tokens=_R)
    rows2 = expand_prompts(prompts, 2)
    g1 = rollout.generate(rows2, greedy)
    _check_layout(what, g1, prompts, 2, eos)
    g2 = rollout.generate(rows2, greedy)
    responses = g1.batch["responses"].cpu()
    if not torch.equal(responses, g2.batch["responses"].cpu()):
        fail(what, "greedy generation must be deterministic", "two calls differ")
    if not torch.equal(responses[0::2], responses[1::2]):
        fail(what, "greedy responses to the same prompt must be identical", "they differ")

    original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 12345)
        other = AutoModelForCausalLM.from_config(original.config).float()
    rollout.update_weights(iter(other.state_dict().items()))
    changed = rollout.generate(rows2, greedy).batch["responses"].cpu()
    if torch.equal(changed, responses):
        fail(
            what,
            "update_weights must change what the rollout generates",
            "greedy outputs unchanged",
        )
    rollout.update_weights(iter(original.state_dict().items()))
    back = rollout.generate(rows2, greedy).batch["responses"].cpu()
    if not torch.equal(back, responses):
        fail(
            what,
            "update_weights with the original weights must restore the original outputs",
            "greedy outputs differ",
        )
