"""Chat templates of three model families, written here (no Hub) after the real ones.

Each is the structure of its family's ``tokenizer_config.json`` template where tool calling
is concerned: where ``tools`` go (Qwen2.5: the system turn; Llama 3.1: the first user turn,
JSON-indented; GLM-4.5: a system block), how a ``tool`` message is wrapped (Qwen2.5: a user
turn of ``<tool_response>`` blocks; Llama 3.1: an ``ipython`` turn, the content JSON-encoded;
GLM-4.5: ``<|observation|>`` then ``<tool_response>`` blocks), and how turns end (``<|im_end|>``,
``<|eot_id|>``, or the next role's token for GLM). Used by the token-exact agent tests.
"""

from __future__ import annotations

from typing import Any

import attrs

QWEN25 = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
    "or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA31 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- if tools is not none %}"
    "{%- set first_user_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\\n\\n' }}"
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of '
    "argument name and its value}. Do not use variables.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{{- first_user_message + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' or message.role == 'ipython' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"
    # As Llama 3.1's own template: a string is iterable, so the content is JSON-encoded.
    "{%- if message.content is mapping or message.content is iterable %}"
    "{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content "
    "| trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

GLM45 = (
    "{{- '[gMASK]<sop>' }}"
    "{%- if tools -%}"
    "{{- '<|system|>\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '</tools>\\n\\nFor each function call, output the function name and arguments within "
    "the following XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>"
    "\\n<arg_value>{arg-value-1}</arg_value>\\n...\\n</tool_call>' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{{- '<|user|>\\n' + m.content }}"
    "{%- elif m.role == 'assistant' -%}{{- '<|assistant|>' }}"
    "{%- set content = m.content -%}"
    "{%- if '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '\\n<think></think>' }}"
    "{%- if content.strip() -%}{{- '\\n' + content.strip() }}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{- '<|observation|>' }}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' }}{{- m.content }}{{- '\\n</tool_response>' }}"
    "{%- elif m.role == 'system' -%}{{- '<|system|>\\n' + m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' }}{%- endif -%}"
)


@attrs.frozen
class Family:
    """A chat layout: its template, special tokens, how a turn ends, its tool-call format."""

    name: str
    template: str
    specials: tuple[str, ...]
    eos: str
    stops: tuple[str, ...]
    parser: str

    def model_kwargs(self) -> dict[str, Any]:
        """``build_tiny_model`` arguments for a tokenizer (and model) of this layout."""
        return {
            "chat_template": self.template,
            "extra_special_tokens": self.specials,
            "eos_token": self.eos,
            "stop_tokens": self.stops,
        }

    def call(self, name: str, args: dict[str, Any]) -> str:
        """The text of one call, as the family's models write it."""
        import json

        if self.parser == "llama3_json":
            return json.dumps({"name": name, "parameters": args})
        if self.parser == "glm45":
            pairs = "".join(
                f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items()
            )
            return f"\n<think></think>\n<tool_call>{name}\n{pairs}</tool_call>"
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"

    def answer(self, text: str) -> str:
        return f"\n<think></think>\n{text}" if self.parser == "glm45" else text


FAMILIES = {
    "qwen25": Family("qwen25", QWEN25, (), "<|im_end|>", (), "hermes"),
    "llama31": Family(
        "llama31",
        LLAMA31,
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|eot_id|>",
        (),
        "llama3_json",
    ),
    "glm45": Family(
        "glm45",
        GLM45,
        ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
        "<|user|>",
        ("<|observation|>",),
        "glm45",
    ),
}
