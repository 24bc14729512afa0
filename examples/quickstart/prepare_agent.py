"""Prepare the agent quickstart: "What is a + b?" where the model may call the calculator.

    python examples/quickstart/prepare.py          # first: the quickstart's model and data
    python examples/quickstart/prepare_agent.py    # then: tool prompts and a tool warm start

Writes under examples/quickstart/work/ (git-ignored):
  data/agent_train.parquet, data/agent_test.parquet
      the quickstart's pairs with a one-line system prompt describing the calculator call
      (rlcore_calculator.environment, data_source "gsm8k_tool")
  model_agent/
      model_sft after a short supervised pass on a mix of direct answers and tool-using
      conversations (call -> tool response -> answer), loss on the model's turns only (the
      tool turn is masked, as in RL), so that RL starts from a model that sometimes calls
      the tool and sometimes answers alone.

Defaults measured: 300 steps with 30% tool conversations left a model whose sampled calls
were mostly malformed JSON (8 of 10 calls failed on 32 samples) and RL did not improve it
in 9 steps; 1000 steps with 50% (26 min on one core of a shared 2-core machine) gave 14
calls with 2 failures, and agent.toml then raised the tool-use rate 0.45 -> 0.91 and the
reward 0.51 -> 0.95 in 20 steps.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prepare import answer, question, split_pairs  # noqa: E402


def _call(a: int, b: int) -> str:
    args = json.dumps({"expression": f"{a}+{b}"})
    return f'<tool_call>{{"name": "calculator", "arguments": {args}}}</tool_call>'


def write_data(out_dir: Path) -> tuple[Path, Path]:
    """The quickstart's train and held-out pairs (its fixed split, the same for every seed)
    with the tool system prompt."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlcore_calculator.environment import make_row

    train, _dev, test = split_pairs()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, pairs in (("agent_train", train), ("agent_test", test)):
        rows = [
            make_row(question(a, b), str(a + b), index=i, split=name, style="short")
            for i, (a, b) in enumerate(pairs)
        ]
        path = out_dir / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return paths[0], paths[1]


def _example(tokenizer, a: int, b: int, use_tool: bool) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one conversation; the tool turn has mask 0."""
    from rlcore.agent.parsers import HermesToolParser
    from rlcore_calculator.environment import system_prompt

    messages = [
        {"role": "system", "content": system_prompt("short")},
        {"role": "user", "content": question(a, b)},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    mask = [0] * len(ids)
    eos = tokenizer.eos_token_id

    def add(text: str, learn: bool, end: bool = False) -> None:
        part = tokenizer.encode(text, add_special_tokens=False) + ([eos] if end else [])
        ids.extend(part)
        mask.extend([int(learn)] * len(part))

    if use_tool:
        add(_call(a, b), learn=True, end=True)
        add(HermesToolParser().format_responses([str(a + b)]), learn=False)
    add(answer(a, b), learn=True, end=True)
    return ids, mask


def warm_start(
    sft_dir: Path, out_dir: Path, *, seed: int = 0, steps: int = 1000, tool_fraction: float = 0.5
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_dir, dtype=torch.float32).train()
    train, _dev, _test = split_pairs()  # the split is fixed; the seed drives sampling
    rng = random.Random(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=5e-4)
    t0, batch_size = time.perf_counter(), 32
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        batch = [
            _example(tokenizer, a, b, rng.random() < tool_fraction)
            for a, b in rng.sample(train, batch_size)
        ]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (ids, mask) in enumerate(batch):
            t = torch.tensor(ids)
            input_ids[row, : len(ids)] = t
            labels[row, : len(ids)] = torch.where(torch.tensor(mask) == 1, t, -100)
            attention[row, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        if step % 25 == 0:
            print(f"tool warm start step {step:4d}  loss {loss.item():.3f}", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    summary = {
        "steps": steps,
        "tool_fraction": tool_fraction,
        "final_loss": round(loss.item(), 4),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "warm_start.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=HERE / "work")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--tool-fraction", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    work: Path = args.work_dir
    sft = work / f"seed{args.seed}" / "model_sft"  # prepare.py --seed N writes there
    if not (sft / "config.json").exists():
        print(f"{sft} is missing: run examples/quickstart/prepare.py first", file=sys.stderr)
        return 1
    train, test = write_data(work / "data")
    print(f"[1/2] wrote {train} and {test}", flush=True)
    summary = warm_start(
        sft, work / "model_agent", seed=args.seed, steps=args.steps,
        tool_fraction=args.tool_fraction,
    )  # fmt: skip
    print(f"[2/2] tool warm start in {work / 'model_agent'}: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
