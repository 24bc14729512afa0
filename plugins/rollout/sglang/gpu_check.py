"""GPU check of the SGLang rollout: generation, weight update, sleep/wake on a real Engine.

    python plugins/rollout/sglang/gpu_check.py        # run by scripts/gpu_check.sh

Exits 0 with one "skipped: ..." line where SGLang or a CUDA device is missing (every CI machine
today); otherwise builds a tiny Qwen2 (bf16), runs rlcore's ``check_rollout`` conformance suite
against ``SGLangRollout`` (layout, masks, log-probs, resumable sampling with deterministic
inference, greedy determinism, ``update_weights`` changing and restoring outputs), then checks
that ``sleep()`` frees GPU memory and ``wake_up()`` + a weight sync + generation gives the same
greedy answers, that concurrent ``generate_one`` calls awaited on a loop of their own (as the
agent loop does) give ``generate``'s greedy rows,
and prints how far SGLang's greedy tokens and log-probs are from the HF rollout's (reported,
not asserted: bf16 kernels differ). Exits 1 if a check fails.

Runs from a plain checkout: ``core/src``, this plugin's ``src`` and the HF rollout's ``src``
go on ``sys.path`` (needs torch with CUDA, transformers, attrs, SGLang).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
for src in ("core/src", "plugins/rollout/sglang/src", "plugins/rollout/hf/src"):
    sys.path.insert(0, str(ROOT / src))


def _skip_reason() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return (
            "skipped: SGLang rollout step (SGLang is not installed; "
            "pip install 'rlcore-sglang[engine]' on a CUDA machine)"
        )
    import torch

    if not torch.cuda.is_available():
        return "skipped: SGLang rollout step (no CUDA device)"
    return None


def main() -> int:
    reason = _skip_reason()
    if reason is not None:
        print(reason)
        return 0

    import attrs
    import torch

    from rlcore.interfaces import RolloutSpec, SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.testing.conformance import check_rollout
    from rlcore.testing.tiny_model import build_tiny_model
    from rlcore_sglang.rollout import SGLangRollout

    class OnCuda(SGLangRollout):
        # check_rollout builds its spec for CPU; SGLang needs the GPU.
        def __init__(self, spec: RolloutSpec, config: SGLangRollout.Config | None = None) -> None:
            # float32: check_rollout bounds log-probs at 1e-3 against a float32 recompute,
            # which bf16 kernels do not meet.
            super().__init__(attrs.evolve(spec, device="cuda", dtype="float32"), config)

    results: list[tuple[str, str, str]] = []

    def record(name: str, fn) -> object:  # noqa: ANN001
        start = time.perf_counter()
        try:
            detail = fn()
        except Exception as err:  # report every check, then exit 1
            traceback.print_exc()
            results.append((name, "FAIL", f"{type(err).__name__}: {err}"[:200]))
            return None
        results.append((name, "ok", f"{detail or ''} ({time.perf_counter() - start:.1f} s)"))
        return detail

    config = SGLangRollout.Config(gpu_memory_utilization=0.3, deterministic=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "model", hidden=128, layers=2, heads=4, kv_heads=2))
        record(
            "check_rollout (conformance)", lambda: check_rollout(OnCuda, config, model_path=path)
        )

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        enc = tok(["Hi", "What is 2+3?", "abc def"], return_tensors="pt", padding=True)
        mask = enc["attention_mask"]
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": enc["input_ids"],
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            }
        )
        greedy = SamplingParams(do_sample=False, max_new_tokens=16, return_log_probs=True)
        spec = RolloutSpec(model_path=path, device="cuda", dtype="bfloat16", max_response_length=16)
        rollout = SGLangRollout(spec, config)
        try:
            first = rollout.generate(prompts, greedy)

            def sleep_wake() -> str:
                torch.cuda.synchronize()
                before = torch.cuda.mem_get_info()[0]
                rollout.sleep()
                torch.cuda.synchronize()
                freed = torch.cuda.mem_get_info()[0] - before
                if freed <= 0:
                    raise AssertionError(f"sleep() freed {freed} bytes")
                rollout.wake_up()
                # sleep() released the weights and SGLang keeps no CPU copy without
                # enable_weights_cpu_backup (weight_updater.py:368-374): sync them back first,
                # as the trainer does after every wake_up.
                from safetensors.torch import load_file

                weights: dict = {}
                for f in sorted(Path(path).glob("*.safetensors")):
                    weights.update(load_file(str(f)))
                rollout.update_weights(iter(weights.items()))
                again = rollout.generate(prompts, greedy)
                if not torch.equal(again.batch["responses"], first.batch["responses"]):
                    raise AssertionError("greedy responses differ after sleep/wake_up")
                return f"sleep freed {freed / 2**20:.0f} MiB; same greedy output after wake_up"

            record("sleep / wake_up", sleep_wake)

            def async_face() -> str:
                import asyncio

                from rlcore_sglang.translate import prompt_token_lists

                rows = prompt_token_lists(enc["input_ids"], mask)

                async def all_rows() -> list:
                    return await asyncio.gather(*(rollout.generate_one(r, greedy) for r in rows))

                # On a loop of its own, as the agent loop awaits it (rlcore/agent/loop.py).
                got = asyncio.run(all_rows())
                want = first.batch["responses"].cpu()
                for i, res in enumerate(got):
                    n = len(res.token_ids)
                    if res.token_ids != want[i, :n].tolist():
                        raise AssertionError(f"generate_one row {i} differs from generate")
                return f"{len(got)} concurrent generate_one calls equal generate's rows"

            record("generate_one", async_face)

            def versus_hf() -> str:
                from rlcore_hf.rollout import HFRollout

                hf = HFRollout(attrs.evolve(spec, dtype="float32"))
                ref = hf.generate(prompts, greedy)
                same = (ref.batch["responses"] == first.batch["responses"].cpu()).float().mean()
                m = (ref.batch["response_mask"] * first.batch["response_mask"].cpu()).bool()
                diff = ref.batch["rollout_log_probs"] - first.batch["rollout_log_probs"].cpu()
                worst = float(diff[m].abs().max()) if bool(m.any()) else float("nan")
                return f"greedy tokens equal HF's: {float(same):.0%}; max |dlogp| {worst:.3g}"

            record("vs HF rollout (reported)", versus_hf)
        finally:
            rollout.close()

    width = max(len(r[0]) for r in results)
    for name, status, detail in results:
        print(f"sglang  {name.ljust(width)}  {status:4}  {detail}")
    return 0 if all(status == "ok" for _, status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
