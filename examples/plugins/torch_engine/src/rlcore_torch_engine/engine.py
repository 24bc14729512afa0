"""TorchEngine: a Hugging Face causal LM trained with plain PyTorch (no FSDP, no DDP wrapper).

Every rank holds the whole model; gradients are summed over ranks before the step (the loss
is already normalised by the mini-batch totals of all ranks, so the sum is the gradient of
the global loss). The device, the micro-batch loop (totals, token-weighted metric means), the
optimizer step's guard (clip, non-finite skip, counters) and the LR schedule come from
:mod:`rlcore.engine`; this file is model, one micro-batch's forward, optimizer, state
and export.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rlcore.engine import (
    OptimizerGuard,
    accumulate_gradients,
    copy_tokenizer_files,
    forward_micro_batches,
    init_device,
)
from rlcore.interfaces import BaseEngine, EngineSpec, LossFn, ModelOutputs, key
from rlcore.protocol import DataProto

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TorchEngine(BaseEngine):
    """Actor or reference engine; float32; CPU or the worker's one GPU."""

    @attrs.frozen(kw_only=True)
    class Config(BaseEngine.Config):
        attn_implementation: str = key("sdpa", "transformers' attn_implementation of the model.")

    def __init__(self, spec: EngineSpec, config: TorchEngine.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: TorchEngine.Config
        from transformers import AutoModelForCausalLM

        self.device = init_device(spec.device)
        self.model = AutoModelForCausalLM.from_pretrained(
            spec.model_path,
            dtype=torch.float32,
            trust_remote_code=spec.trust_remote_code,
            attn_implementation=self.config.attn_implementation,
        ).to(self.device)
        self.optimizer = None
        if spec.optim is not None and spec.role != "ref":
            o = spec.optim
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=o.lr,
                betas=o.betas,
                eps=o.eps,
                weight_decay=o.weight_decay,
            )
            self.guard = OptimizerGuard(self.optimizer, role=spec.role, max_norm=spec.grad_clip)

    # --- forward ----------------------------------------------------------------------------

    def _forward(self, mb: DataProto, temperature: float, entropy: bool) -> ModelOutputs:
        b = mb.batch
        responses = b["responses"].to(self.device)  # (b, R)
        r = responses.shape[1]
        logits = (
            self.model(
                input_ids=b["input_ids"].to(self.device),
                attention_mask=b["attention_mask"].to(self.device),
                position_ids=b["position_ids"].to(self.device),
                use_cache=False,
            )
            .logits[:, -(r + 1) : -1]
            .float()
        )  # (b, R, V): position t predicts token t+1
        if temperature not in (0.0, 1.0):
            logits = logits / temperature  # the distribution the rollout sampled from
        logp = torch.log_softmax(logits, -1)
        out = ModelOutputs(log_probs=logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1))
        if entropy:
            out.entropy = -(logp.exp() * logp).sum(-1)
        return out

    def forward_backward(
        self, batch: DataProto, loss_fn: LossFn, *, temperature: float, with_entropy: bool = False
    ) -> dict[str, float]:
        self.model.train()
        forward = functools.partial(self._forward, temperature=temperature, entropy=with_entropy)
        return accumulate_gradients(batch, loss_fn, forward, spec=self.spec, device=self.device)

    def optimizer_step(self, *, lr: float) -> float:
        if self.optimizer is None:
            msg = f"[{self.spec.role}] the torch engine has no optimizer"
            raise RuntimeError(msg)
        if dist.get_world_size() > 1:
            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)  # sum: the loss is normalised globally
        return self.guard.step(lr=lr)

    def compute_log_prob(
        self, batch: DataProto, *, temperature: float, with_entropy: bool = False
    ) -> ModelOutputs:
        self.model.eval()
        forward = functools.partial(self._forward, temperature=temperature, entropy=with_entropy)
        return forward_micro_batches(batch, forward, spec=self.spec, device=self.device)

    # --- weights and state ------------------------------------------------------------------

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()

    def save_checkpoint(self, path: str) -> None:
        if dist.get_rank() == 0:  # every rank holds the same replica
            Path(path).mkdir(parents=True, exist_ok=True)
            state: dict[str, Any] = {"model": self.model.state_dict()}
            if self.optimizer is not None:
                state["optim"] = self.optimizer.state_dict()
            torch.save(state, Path(path) / "torch_engine.pt")
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        # weights_only: tensors and plain containers, never code from a checkpoint.
        state = torch.load(Path(path) / "torch_engine.pt", weights_only=True, map_location="cpu")
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optim" in state:
            self.optimizer.load_state_dict(state["optim"])

    def export_hf(self, path: str) -> None:
        if dist.get_rank() == 0:
            out = Path(path)
            self.model.save_pretrained(out, safe_serialization=True)
            copy_tokenizer_files(self.spec.model_path, out, _TOKENIZER_FILES)
        dist.barrier()
