"""TorchEngine: a Hugging Face causal LM trained with plain PyTorch (no FSDP, no DDP wrapper).

Every rank holds the whole model; gradients are summed over ranks before the step (the loss
is already normalised by the mini-batch totals of all ranks, so the sum is the gradient of
the global loss). The LR schedule, micro-batching, the totals and the non-finite skip come
from :mod:`rlcore.engine_utils`; this file is model, forward, backward, optimizer, state and
export.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rlcore.engine_utils import batch_totals, clip_and_step, split_micro_batches
from rlcore.interfaces import BaseEngine, EngineSpec, LossFn, ModelOutputs
from rlcore.protocol import DataProto

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TorchEngine(BaseEngine):
    """Actor or reference engine; float32; CPU or the worker's one GPU."""

    @attrs.frozen(kw_only=True)
    class Config(BaseEngine.Config):
        attn_implementation: str = "sdpa"

    def __init__(self, spec: EngineSpec, config: TorchEngine.Config | None = None) -> None:
        super().__init__(spec, config)
        self.config: TorchEngine.Config
        from transformers import AutoModelForCausalLM

        cuda = spec.device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
        self.device = self.device or torch.device("cpu")
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
        totals = batch_totals(batch, self.device)  # the whole mini-batch, all ranks
        spec = self.spec
        sums: dict[str, float] = {}
        weight = 0.0
        for mb in split_micro_batches(
            batch,
            micro_batch_size=spec.micro_batch_size,
            max_tokens=spec.max_tokens_per_micro_batch,
        ):
            mb = mb.to(self.device)
            loss, metrics = loss_fn(self._forward(mb, temperature, with_entropy), mb, totals)
            loss.backward()
            w = float(mb.batch["response_mask"].sum()) or 1e-9
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value) * w
            weight += w
        return {key: value / weight for key, value in sums.items()}

    def optimizer_step(self, *, lr: float) -> float:
        if self.optimizer is None:
            msg = f"[{self.spec.role}] the torch engine has no optimizer"
            raise RuntimeError(msg)
        if dist.is_initialized() and dist.get_world_size() > 1:
            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)  # sum: the loss is normalised globally
        return clip_and_step(
            self.optimizer, self.model.parameters(), lr=lr, max_norm=self.spec.grad_clip
        )

    @torch.no_grad()
    def compute_log_prob(
        self, batch: DataProto, *, temperature: float, with_entropy: bool = False
    ) -> ModelOutputs:
        self.model.eval()
        spec = self.spec
        outs = [
            self._forward(mb, temperature, with_entropy)
            for mb in split_micro_batches(
                batch,
                micro_batch_size=spec.micro_batch_size,
                max_tokens=spec.max_tokens_per_micro_batch,
            )
        ]
        log_probs = torch.cat([o.log_probs for o in outs if o.log_probs is not None]).cpu()
        entropy = (
            torch.cat([o.entropy for o in outs if o.entropy is not None]).cpu()
            if with_entropy
            else None
        )
        return ModelOutputs(log_probs=log_probs, entropy=entropy)

    # --- weights and state ------------------------------------------------------------------

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.model.state_dict().items()

    def _rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def save_checkpoint(self, path: str) -> None:
        if self._rank() == 0:  # every rank holds the same replica
            Path(path).mkdir(parents=True, exist_ok=True)
            state: dict[str, Any] = {"model": self.model.state_dict()}
            if self.optimizer is not None:
                state["optim"] = self.optimizer.state_dict()
            torch.save(state, Path(path) / "torch_engine.pt")
        self._barrier()

    def load_checkpoint(self, path: str) -> None:
        # weights_only: tensors and plain containers, never code from a checkpoint.
        state = torch.load(Path(path) / "torch_engine.pt", weights_only=True, map_location="cpu")
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optim" in state:
            self.optimizer.load_state_dict(state["optim"])

    def export_hf(self, path: str) -> None:
        if self._rank() == 0:
            out = Path(path)
            self.model.save_pretrained(out, safe_serialization=True)
            for name in _TOKENIZER_FILES:
                if (Path(self.spec.model_path) / name).is_file():
                    shutil.copy2(Path(self.spec.model_path) / name, out / name)
        self._barrier()
