"""Prepare the OpenAI-client agent quickstart (agent_openai.toml) from the agent quickstart's model.

    python examples/quickstart/prepare.py            # the quickstart's model and data
    python examples/quickstart/prepare_agent.py      # tool prompts and the tool warm start
    python examples/quickstart/prepare_agent_openai.py

Copies work/model_agent to work/model_agent_openai with one change: a chat template that
renders ``tool`` messages in Qwen2.5's layout (``<|im_start|>user\\n<tool_response>...``),
the layout prepare_agent.py's warm start wrote tool turns in. The agent sends OpenAI messages
(``role: "tool"``), the endpoint renders them with the tokenizer's template, so the model sees
the tool turns it was warm-started on and each prompt extends the previous call token for
token (no splits; agent/splits stays 0).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ChatML for system/user/assistant (content verbatim), Qwen2.5's grouping of tool results.
TOOL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=HERE / "work")
    args = parser.parse_args(argv)
    src, dst = args.work_dir / "model_agent", args.work_dir / "model_agent_openai"
    if not src.is_dir():
        print(f"{src} is missing: run examples/quickstart/prepare_agent.py first", file=sys.stderr)
        return 1
    from transformers import AutoTokenizer

    shutil.copytree(src, dst, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(dst)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.save_pretrained(dst)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
