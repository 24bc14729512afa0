"""GPU check of the megatron engine on one device (NCCL, 1 rank), from a plain checkout.

    python plugins/engines/megatron/scripts/gpu_check.py [--device cuda|cpu] [--steps 3]

Builds a tiny Qwen2, then: logits against transformers (float32, TF32 off), a few optimizer
steps, HF-named weight sync, checkpoint save/load (log-probs restored exactly) and export to a
Hugging Face folder that transformers loads with equal logits. Prints a table; exits 1 if a
check fails. ``core/src`` and this plugin's ``src`` go on ``sys.path``; megatron-core
(0.16.1), torch, transformers, safetensors and attrs must be importable.
``--device cpu`` is a dry run with gloo and the CPU compatibility layer.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
for src in ("core/src", "plugins/engines/megatron/src"):
    sys.path.insert(0, str(ROOT / src))

import torch  # noqa: E402

from rlcore.interfaces import EngineSpec, OptimConfig  # noqa: E402
from rlcore.protocol import DataProto  # noqa: E402
from rlcore.testing.tiny_model import build_tiny_model  # noqa: E402
from rlcore_megatron.engine import MegatronEngine  # noqa: E402


def make_batch(device: str, rows: int = 8, prompt: int = 24, response: int = 16) -> DataProto:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    mask = torch.ones(rows, response, dtype=torch.long)
    for i in range(rows):
        attn[i, : (3 * i) % prompt] = 0
        mask[i, response - i % 4 :] = 0
        attn[i, prompt + response - i % 4 :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": mask,
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def loss_fn(outputs, mb, totals):  # noqa: ANN001, ANN201
    mask = mb.batch["response_mask"].to(outputs.log_probs.device).float()
    adv = mb.batch["advantages"].to(outputs.log_probs.device)
    loss = -(outputs.log_probs * adv * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def parse_args(steps: int) -> argparse.Namespace:
    """``--device`` and ``--steps``; TF32 off, so float32 comparisons hold to 1e-4."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=steps)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return args


class CheckTable:
    """One printed line per check as it runs, then the summary line and the exit code."""

    def __init__(self, title: str, width: int) -> None:
        self.title, self.width = title, width
        self.rows: list[tuple[str, str, bool]] = []

    def __call__(self, name: str, value: str, ok: bool) -> None:
        self.rows.append((name, value, ok))
        print(f"{'ok ' if ok else 'FAIL'} {name:<{self.width}} {value}", flush=True)

    def finish(self, device: str) -> int:
        """The peak GPU memory row (on CUDA), the summary; 1 if any check failed."""
        if device == "cuda":
            self("peak GPU memory", f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", True)
        failed = [name for name, _, ok in self.rows if not ok]
        print(f"{self.title}:", "FAILED " + ", ".join(failed) if failed else "all passed")
        return 1 if failed else 0


def checkpoint_restores(engine: MegatronEngine, batch: DataProto, folder: Path) -> bool:
    """Save, take a step, load: the log-probs equal those at the save, bit for bit."""
    before = engine.compute_log_prob(batch, temperature=1.0).log_probs
    engine.save_checkpoint(str(folder))
    engine.forward_backward(batch, loss_fn, temperature=1.0)
    engine.optimizer_step(lr=1e-3)
    engine.load_checkpoint(str(folder))
    return torch.equal(before, engine.compute_log_prob(batch, temperature=1.0).log_probs)


def hf_logits(path: str, batch: DataProto, device: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    b = {k: v.to(device) for k, v in batch.batch.items()}
    with torch.no_grad():
        out = model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        )
    return out.logits.float().cpu()


def main() -> int:
    args = parse_args(steps=3)
    check = CheckTable("megatron GPU check", width=34)

    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "model", hidden=256, layers=4, heads=8))
        spec = EngineSpec(
            role="actor",
            model_path=path,
            device=args.device,
            optim=OptimConfig(lr=1e-4),
            micro_batch_size=4,
        )
        start = time.perf_counter()
        engine = MegatronEngine(spec)
        check("build (GPTModel, HF weights)", f"{time.perf_counter() - start:.1f} s", True)
        batch = make_batch(args.device)
        keep = batch.batch["attention_mask"].bool()
        diff = float(
            (engine.compute_logits(batch) - hf_logits(path, batch, args.device))[keep].abs().max()
        )
        check("logits vs transformers", f"max |diff| {diff:.2e}", diff < 1e-4)
        losses = []
        for _ in range(args.steps):
            losses.append(engine.forward_backward(batch, loss_fn, temperature=1.0)["loss"])
            norm = engine.optimizer_step(lr=1e-3)
        check(
            "train steps",
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, grad norm {norm:.3f}",
            math.isfinite(norm) and losses[-1] < losses[0],
        )
        names = [n for n, _ in engine.named_parameters_for_sync()]
        check("weight sync (HF names)", f"{len(names)} tensors", "lm_head.weight" in names)
        ok = checkpoint_restores(engine, batch, Path(tmp) / "ckpt")
        check("checkpoint save/load", "log-probs restored", ok)
        engine.export_hf(str(Path(tmp) / "hf"))
        exported = hf_logits(str(Path(tmp) / "hf"), batch, args.device)
        diff = float((engine.compute_logits(batch) - exported)[keep].abs().max())
        check("export_hf -> transformers", f"max |diff| {diff:.2e}", diff < 1e-4)
    return check.finish(args.device)


if __name__ == "__main__":
    sys.exit(main())
