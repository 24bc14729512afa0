"""Print sample conversations of a trained agent model (greedy), for the closing note.

python examples/quickstart/agent_sample.py runs/quickstart-agent/final_hf 12+34 57+68
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer

    from rlcore.agent.loop import AgentLoop
    from rlcore.config import AgentConfig
    from rlcore.interfaces import RolloutSpec, SamplingParams
    from rlcore.protocol import DataProto
    from rlcore_calculator.environment import system_prompt
    from rlcore_calculator.tool import CalculatorTool
    from rlcore_hf.rollout import HFRollout

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("pairs", nargs="+", help="a+b")
    args = parser.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(args.model)
    texts = []
    for pair in args.pairs:
        a, b = pair.split("+")
        messages = [
            {"role": "system", "content": system_prompt("short")},
            {"role": "user", "content": f"What is {int(a)} + {int(b)}?"},
        ]
        texts.append(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    enc = tok(texts, padding=True, padding_side="left", return_tensors="pt")
    mask = enc["attention_mask"]
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )
    rollout = HFRollout(RolloutSpec(model_path=args.model))
    loop = AgentLoop(tok, [CalculatorTool()], AgentConfig(tools=("calculator",), max_turns=2))
    with torch.no_grad():
        out = loop.generate(rollout, prompts, SamplingParams(max_new_tokens=192, do_sample=False))
    for pair, agent in zip(args.pairs, out.non_tensor_batch["agent"]):
        print(f"--- {pair}  (tool calls {agent['tool_calls']}, errors {agent['tool_errors']})")
        for turn in agent["turns"]:
            print(f"[{turn['role']}] {turn['content']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
