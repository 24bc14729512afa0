"""The vLLM rollout's next-token distributions (the training-inference consistency check).

vLLM scores a given sequence through ``prompt_logprobs``: with ``-1`` (the whole vocabulary,
allowed by the engine's ``max_logprobs = -1``) each position of the prompt comes back with
its log-probabilities over every token, computed by the engine's own forward (kernels,
dtype), untempered and unprocessed (vLLM 0.32 ``config/model.py``: for prompt log-probs
``processed_*`` and ``raw_*`` agree). Prompt and response of a row go in as one prompt, one
row per request, ``flat_logprobs`` (flat lists, not a dict per position): a row of
``L`` tokens holds ``L x V`` floats, so rows are not batched.

Hidden states come from forward hooks on the decoder layers, where vLLM runs the model in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the CPU default): a vLLM decoder layer
returns ``(hidden_states, residual)`` with the residual add deferred to the next layer's
norm, so the residual stream after the layer is their sum.
"""

from __future__ import annotations

from typing import Any

import torch

from rlcore.interfaces import TokenDistributions
from rlcore.protocol import DataProto

__all__ = ["vllm_next_token_distributions"]


def _decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def vllm_next_token_distributions(
    llm: Any, batch: DataProto, vocab_size: int, *, hidden_states: bool, in_process: bool
) -> TokenDistributions:
    """(B, R, V) log-probs over ``responses`` and, in process, each layer's (B, R, H)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    b = batch.batch
    responses, response_mask = b["responses"], b["response_mask"]
    rows, r = responses.shape
    p = b["input_ids"].shape[1] - r
    prompt_mask = b["attention_mask"][:, :p].bool()
    params = VSamplingParams(
        max_tokens=1, temperature=0.0, prompt_logprobs=-1, flat_logprobs=True, detokenize=False
    )
    logits = torch.zeros((rows, r, vocab_size), dtype=torch.float32)
    captured: list[torch.Tensor] = []
    per_layer: list[list[torch.Tensor]] = []
    hooks = hidden_states and in_process
    for i in range(rows):
        prompt = b["input_ids"][i, :p][prompt_mask[i]].tolist()
        n = int(response_mask[i].sum())
        if n == 0:
            continue
        tokens = prompt + responses[i, :n].tolist()
        captured.clear()
        handles = _hook_layers(llm, captured) if hooks else []
        try:
            (out,) = llm.generate(TokensPrompt(prompt_token_ids=tokens), params, use_tqdm=False)
        finally:
            for handle in handles:
                handle.remove()
        flat = out.prompt_logprobs  # position t: the distribution of token t given tokens[:t]
        for j in range(n):
            t = len(prompt) + j
            start, end = flat.start_indices[t], flat.end_indices[t]
            ids = torch.tensor(flat.token_ids[start:end], dtype=torch.long)
            values = torch.tensor(flat.logprobs[start:end], dtype=torch.float32)
            logits[i, j].scatter_(0, ids, values)
        if hooks:
            # The first forward is the prefill of the whole sequence: L rows per layer.
            layers = len(_decoder_layers_of(llm))
            states = [h for h in captured if h.shape[0] == len(tokens)][:layers]
            if not per_layer:
                per_layer = [
                    torch.zeros((rows, r, s.shape[-1]), dtype=torch.float32) for s in states
                ]
            for layer, s in zip(per_layer, states):
                layer[i, :n] = s[len(prompt) - 1 : len(prompt) - 1 + n].float()
    return TokenDistributions(logits=logits, hidden_states=per_layer if hooks else None)


def _decoder_layers_of(llm: Any) -> list[Any]:
    layers: list[list[Any]] = llm.apply_model(_decoder_layers)
    return layers[0]


def _hook_layers(llm: Any, captured: list[torch.Tensor]) -> list[Any]:
    def keep(_module: Any, _args: Any, out: Any) -> None:
        hidden, residual = out if isinstance(out, tuple) else (out, None)
        stream = hidden if residual is None else hidden + residual
        captured.append(stream.detach().float().cpu())

    return [layer.register_forward_hook(keep) for layer in _decoder_layers_of(llm)]
