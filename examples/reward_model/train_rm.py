"""Train the quickstart's reward model: a tiny Qwen2 sequence classifier that tells a correct
"a + b" answer from a wrong one, for GRPO with that model as the only reward (grpo_rm.toml).

    python examples/quickstart/prepare.py --seed 0      # data + the warm-started policy
    python examples/reward_model/train_rm.py            # -> examples/reward_model/work/rm

Data, from the quickstart's split (prepare.py): prompts of the train pairs to train on, of the
dev pairs to measure on (never trained on; GRPO validates on the test pairs). Each prompt gets
responses of two kinds, labelled by the GSM8K strict rule (the last "#### n" is the sum):

- written: the right answer "a + b = s\\n#### s", and wrong ones: the sum off by a small
  number (both places), the right equation with a wrong final answer, and the sum of two
  other numbers;
- sampled: ``--samples`` responses of the warm-started policy at temperature 1, what GRPO's
  first steps score (a mix of right, wrong and malformed answers).

Each (prompt, response) is laid out exactly as the run scores it: the chat-formatted prompt
with the generation prompt, then the response tokens and the end-of-turn token, in the
policy's own tokenizer (the reward model shares it, so the run sends the policy's ids as they
are: ``retokenize = "auto"``).

Model: the warm-started policy's backbone (or ``--init``'s) with a fresh one-label score head
(``AutoModelForSequenceClassification``, num_labels = 1), the score read at the last token:
the end-of-turn token, where the reward-model role reads it too.
Loss: on pairs of one prompt (a right and a wrong response, both kinds above), Bradley-Terry
on the pair's margin plus the pointwise logistic loss of both rows, so that the score is the
logit of "right" (verdict: score > 0); AdamW. Every ``--eval-every`` steps the held-out
accuracy (score > 0 against the rule) is measured, and ``pair_acc``: how often a prompt's
right response scores above its wrong one (GRPO's advantages use only that order); the
curve goes to ``<out>/rm_train.jsonl``, the final numbers to ``<out>/rm_summary.json``, the model
(``save_pretrained``) and tokenizer to ``<out>/rm``. The data set is kept in
``<out>/rm_data.json`` (JSON token ids) and reused by a rerun with the same arguments.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "quickstart"
sys.path.insert(0, str(QUICKSTART))

from prepare import _prompt_text, answer, split_pairs, strict_score  # noqa: E402

Example = tuple[list[int], int, float, str, int]  # (ids, label 0/1, rule, kind, prompt)


def written(a: int, b: int, rng: random.Random) -> list[tuple[str, str]]:
    """The right answer and three wrong ones, as (text, kind)."""
    s = a + b
    off = s + rng.choice([d for d in range(-10, 11) if d and s + d >= 0])
    final = s + rng.choice([d for d in (-10, -2, -1, 1, 2, 10) if s + d >= 0])
    c, d = rng.randrange(100), rng.randrange(100)
    other = c + d if c + d != s else s + 1
    return [
        (answer(a, b), "right"),
        (f"{a} + {b} = {off}\n#### {off}", "off_by_small"),
        (f"{a} + {b} = {s}\n#### {final}", "wrong_final"),
        (f"{a} + {b} = {other}\n#### {other}", "other_sum"),
    ]


def sampled(model, tokenizer, pairs, samples: int, seed: int, batch: int = 128):
    """``samples`` policy responses per pair at temperature 1: (pair index, ids, text)."""
    import torch

    torch.manual_seed(seed)
    out = []
    prompts = [p for p in range(len(pairs)) for _ in range(samples)]
    model.eval()
    for start in range(0, len(prompts), batch):
        rows = prompts[start : start + batch]
        texts = [_prompt_text(tokenizer, *pairs[p]) for p in rows]
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
        with torch.no_grad():
            gen = model.generate(
                **enc,
                max_new_tokens=24,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        for p, ids in zip(rows, gen[:, enc["input_ids"].shape[1] :].tolist()):
            if tokenizer.eos_token_id in ids:  # keep the end-of-turn token, as the run does
                ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
            else:
                ids = [t for t in ids if t != tokenizer.pad_token_id]
            out.append((p, ids, tokenizer.decode(ids, skip_special_tokens=True)))
    return out


def examples(model, tokenizer, pairs, samples: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    eos = tokenizer.eos_token_id
    prompt_ids = [tokenizer(_prompt_text(tokenizer, a, b))["input_ids"] for a, b in pairs]
    out: list[Example] = []
    for i, (a, b) in enumerate(pairs):
        for text, kind in written(a, b, rng):
            rule = strict_score(text, str(a + b))
            ids = prompt_ids[i] + tokenizer(text)["input_ids"] + [eos]
            out.append((ids, int(rule > 0), rule, kind, i))
    if samples:
        for i, ids, text in sampled(model, tokenizer, pairs, samples, seed):
            a, b = pairs[i]
            rule = strict_score(text, str(a + b))
            out.append((prompt_ids[i] + ids, int(rule > 0), rule, "sampled", i))
    return out


def pair_batch(by_prompt: list[tuple[list[Example], list[Example]]], n: int, rng) -> list[Example]:
    """``n`` prompts, each with one right and one wrong response: rows 2k (right), 2k + 1."""
    out: list[Example] = []
    for right, wrong in rng.sample(by_prompt, n):
        out += [rng.choice(right), rng.choice(wrong)]
    return out


def cached_examples(path: Path, key: dict, make) -> tuple[list[Example], list[Example]]:
    """The data set from ``path`` when it was made with the same ``key`` (JSON), else made."""
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return [tuple(e) for e in saved["train"]], [tuple(e) for e in saved["held_out"]]
    train, held_out = make()
    path.write_text(json.dumps({"key": key, "train": train, "held_out": held_out}))
    return train, held_out


def left_padded(batch: list[Example], pad: int):
    import torch

    width = max(len(ids) for ids, *_ in batch)
    ids_t = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, *_) in enumerate(batch):
        ids_t[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    labels = torch.tensor([float(label) for _, label, *_ in batch])
    return ids_t, mask, pos, labels


def scores(rm, ids, mask, pos):
    """The score head at the last position (every row ends there: left padding)."""
    hidden = rm.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    return rm.score(hidden[:, -1]).squeeze(-1)


def evaluate(rm, data: list[Example], pad: int, batch: int = 256) -> dict[str, float]:
    """Accuracy of ``score > 0`` against the rule: overall and per kind of response."""
    import torch

    rm.eval()
    hits: dict[str, list[bool]] = {}
    by_prompt: dict[int, tuple[list[float], list[float]]] = {}
    with torch.no_grad():
        for start in range(0, len(data), batch):
            part = data[start : start + batch]
            s = scores(rm, *left_padded(part, pad)[:3])
            for (_, label, _, kind, prompt), value in zip(part, s.tolist()):
                hits.setdefault(kind, []).append((value > 0) == bool(label))
                by_prompt.setdefault(prompt, ([], []))[0 if label else 1].append(value)
    rm.train()
    every = [h for hs in hits.values() for h in hs]
    out = {"acc": sum(every) / len(every)}
    out |= {f"acc/{kind}": sum(h) / len(h) for kind, h in sorted(hits.items())}
    # What GRPO uses: the order of one prompt's responses (its advantages are relative).
    ranked = [r > w for right, wrong in by_prompt.values() for r in right for w in wrong]
    if ranked:
        out["pair_acc"] = sum(ranked) / len(ranked)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=QUICKSTART / "work", help="prepare.py's")
    parser.add_argument("--seed", type=int, default=0, help="the warm start (seed<N>) and RNG")
    parser.add_argument("--out", type=Path, default=HERE / "work")
    parser.add_argument(
        "--init",
        type=Path,
        default=None,
        help="backbone the reward model starts from (default: the warm start, seed<N>/model_sft);"
        " e.g. a GRPO-trained policy's final_hf (it must share the warm start's tokenizer)",
    )
    parser.add_argument("--train-prompts", type=int, default=1000)
    parser.add_argument("--eval-prompts", type=int, default=200, help="dev pairs (all 200)")
    parser.add_argument("--samples", type=int, default=2, help="policy samples per prompt")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument(
        "--start-step",
        type=int,
        default=0,
        help="continue a run stopped at this step (with --init its saved rm): skip the batches "
        "it drew, so the pairs go on where it stopped (the optimizer state starts afresh)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="stop (evaluate, save) past this wall time"
    )
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    sft = args.work_dir / f"seed{args.seed}" / "model_sft"
    if not (sft / "config.json").is_file():
        print(f"error: no warm start at {sft}; run: python examples/quickstart/prepare.py "
              f"--seed {args.seed} --work-dir {args.work_dir}", file=sys.stderr)  # fmt: skip
        return 2
    torch.manual_seed(args.seed)
    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(sft)
    pad = tokenizer.pad_token_id
    train_pairs, dev_pairs, _ = split_pairs()
    rng = random.Random(args.seed)
    train_pairs = rng.sample(train_pairs, min(args.train_prompts, len(train_pairs)))
    dev_pairs = dev_pairs[: args.eval_prompts]

    def make() -> tuple[list[Example], list[Example]]:
        policy = AutoModelForCausalLM.from_pretrained(sft)
        train = examples(policy, tokenizer, train_pairs, args.samples, args.seed)
        held_out = examples(policy, tokenizer, dev_pairs, args.samples, args.seed + 1)
        return train, held_out

    args.out.mkdir(parents=True, exist_ok=True)
    key = {"sft": str(sft), "seed": args.seed, "train": len(train_pairs), "dev": len(dev_pairs),
           "samples": args.samples}  # fmt: skip
    train, held_out = cached_examples(args.out / "rm_data.json", key, make)
    by_prompt: dict[int, tuple[list[Example], list[Example]]] = {}
    for e in train:
        by_prompt.setdefault(e[4], ([], []))[0 if e[1] else 1].append(e)
    usable = [rw for rw in by_prompt.values() if rw[0] and rw[1]]
    positives = sum(label for _, label, *_ in train)
    print(f"data: {len(train)} train ({positives} right), {len(held_out)} held-out rows; "
          f"{time.time() - started:.0f} s")  # fmt: skip

    init = args.init if args.init is not None else sft
    rm = AutoModelForSequenceClassification.from_pretrained(init, num_labels=1)
    rm.config.pad_token_id = pad
    optim = torch.optim.AdamW(rm.parameters(), lr=args.lr, weight_decay=0.0)
    bce = torch.nn.BCEWithLogitsLoss()
    curve = (args.out / "rm_train.jsonl").open("w")
    first = {"step": args.start_step, **evaluate(rm, held_out, pad)}
    curve.write(json.dumps(first) + "\n")
    print(f"step {args.start_step:4d}  held-out acc {first['acc']:.3f}  "
          f"pair acc {first['pair_acc']:.3f}")  # fmt: skip
    rm.train()
    losses: list[float] = []
    hits: list[bool] = []
    for _ in range(args.start_step):  # the batches the run being continued trained on
        pair_batch(usable, args.batch_size // 2, rng)
    for step in range(args.start_step + 1, args.steps + 1):
        # Pairs of one prompt (a right and a wrong response): Bradley-Terry on the pair's
        # margin, plus the pointwise logistic loss of both (so that score > 0 means right;
        # the pairs balance the classes).
        batch = pair_batch(usable, args.batch_size // 2, rng)
        ids, mask, pos, labels = left_padded(batch, pad)
        logits = scores(rm, ids, mask, pos)
        pairwise = -torch.nn.functional.logsigmoid(logits[0::2] - logits[1::2]).mean()
        loss = pairwise + bce(logits, labels)
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        optim.step()
        losses.append(float(loss.detach()))
        hits += ((logits.detach() > 0) == labels.bool()).tolist()
        out_of_time = args.max_seconds is not None and time.time() - started > args.max_seconds
        if step % args.eval_every == 0 or step == args.steps or out_of_time:
            row = {
                "step": step,
                "loss": sum(losses) / len(losses),
                "train_acc": sum(hits) / len(hits),
                **evaluate(rm, held_out, pad),
                "elapsed_s": round(time.time() - started, 1),
            }
            curve.write(json.dumps(row) + "\n")
            curve.flush()
            print(f"step {step:4d}  loss {row['loss']:.3f}  train acc {row['train_acc']:.3f}  "
                  f"held-out acc {row['acc']:.3f}  pair acc {row.get('pair_acc', 0):.3f}  "
                  f"({row['elapsed_s']:.0f} s)")  # fmt: skip
            losses, hits = [], []
        if out_of_time:
            print(f"stopping at step {step}: --max-seconds {args.max_seconds:g} reached")
            break
    curve.close()
    rm.save_pretrained(args.out / "rm", safe_serialization=True)
    tokenizer.save_pretrained(args.out / "rm")
    summary = {"held_out": row, "train_rows": len(train), "held_out_rows": len(held_out)}
    (args.out / "rm_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"reward model saved to {args.out / 'rm'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
