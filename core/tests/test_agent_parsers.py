"""The Hermes/Qwen tool-call parser: calls found in a model turn, malformed ones reported."""

from __future__ import annotations

from rlcore.agent.parsers import HermesToolParser, ToolCall, get_parser


def test_finds_every_call_with_its_arguments():
    text = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}'
        '</tool_call> and <tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}\n'
        "</tool_call>"
    )
    calls, errors = HermesToolParser().parse(text)
    assert errors == []
    assert calls == [
        ToolCall(name="calculator", arguments={"expression": "2+3"}),
        ToolCall(name="search", arguments={"q": "x"}),
    ]


def test_no_call_is_a_final_answer():
    assert HermesToolParser().parse("5 + 3 = 8\n#### 8") == ([], [])


def test_malformed_calls_are_errors_not_exceptions():
    parser = get_parser("qwen")
    _, errors = parser.parse("<tool_call>{not json}</tool_call>")
    assert len(errors) == 1
    assert "not valid JSON" in errors[0]
    _, errors = parser.parse('<tool_call>["calculator"]</tool_call>')
    assert 'string "name"' in errors[0]
    _, errors = parser.parse('<tool_call>{"name": "c", "arguments": 3}</tool_call>')
    assert "must be a JSON object" in errors[0]
    calls, errors = parser.parse('<tool_call>{"name": "calculator", "arguments": {}')
    assert calls == []
    assert errors == ["tool call without a closing </tool_call>"]


def test_tool_turn_follows_qwen_chat_template():
    text = HermesToolParser().format_responses(["5", "error: x"])
    assert text == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\nerror: x\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
