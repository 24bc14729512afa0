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


# --- hostile model output: bounded before json.loads, an error value, never an exception ----


def test_1500_open_brackets_are_an_error_not_a_recursion_error():
    calls, errors = HermesToolParser().parse("<tool_call>" + "[" * 1500 + "</tool_call>")
    assert calls == []
    assert errors == ["tool call nests deeper than 32 levels"]
    # Unclosed: no body to read, the missing tag is the one error.
    _, errors = HermesToolParser().parse('<tool_call>{"name": "c", "arguments": ' + "[" * 1500)
    assert errors == ["tool call without a closing </tool_call>"]


def test_a_4400_digit_integer_is_an_error_not_a_value_error():
    text = '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 4400 + "}}</tool_call>"
    assert HermesToolParser().parse(text) == (
        [],
        ["tool call holds a number of more than 100 digits"],
    )
    # The same inside JSON-encoded arguments.
    inner = '{\\"a\\": ' + "9" * 4400 + "}"
    text = '<tool_call>{"name": "add", "arguments": "' + inner + '"}</tool_call>'
    assert HermesToolParser().parse(text) == (
        [],
        ["arguments of 'add' are not a JSON object (holds a number of more than 100 digits)"],
    )


def test_bounds_count_structure_not_string_contents():
    # Brackets and digits inside strings are data: a long digit string or a bracketed text
    # argument parses.
    args = {"text": "[" * 1500, "digits": "7" * 4400}
    import json

    text = "<tool_call>" + json.dumps({"name": "echo", "arguments": args}) + "</tool_call>"
    assert HermesToolParser().parse(text) == ([ToolCall(name="echo", arguments=args)], [])
    # 100 digits still parse; 32 levels too.
    ok = '{"name": "n", "arguments": {"a": ' + "1" * 100 + ', "b": ' + "[" * 30 + "]" * 30 + "}}"
    calls, errors = HermesToolParser().parse(f"<tool_call>{ok}</tool_call>")
    assert errors == []
    assert calls[0].arguments["a"] == int("1" * 100)


def test_an_oversized_call_is_an_error_and_the_next_call_still_parses():
    big = '{"name": "echo", "arguments": {"t": "' + "x" * (64 * 1024) + '"}}'
    good = '{"name": "echo", "arguments": {}}'
    calls, errors = HermesToolParser().parse(
        f"<tool_call>{big}</tool_call><tool_call>{good}</tool_call>"
    )
    assert errors == ["tool call is longer than 65536 characters"]
    assert calls == [ToolCall(name="echo", arguments={})]


def test_every_kind_of_damage_returns_values():
    # A sweep of hostile shapes: parse returns (list, list) for each, whatever the text.
    cases = [
        "<tool_call>" * 1000,
        "</tool_call>" * 1000 + "<tool_call>",
        "<tool_call>" + "{" * 10_000 + "</tool_call>",
        '<tool_call>{"name": "x", "arguments": "' + "[" * 1500 + '"}</tool_call>',
        '<tool_call>{"name": "x", "arguments": "' + "9" * 5000 + '"}</tool_call>',
        '<tool_call>{"name": "x", "arguments": 1e999999}</tool_call>',
        "<tool_call>\ud800</tool_call>",
        '<tool_call>{"name": ' + "1" * 4400 + "}</tool_call>",
    ]
    for text in cases:
        calls, errors = HermesToolParser().parse(text)
        assert isinstance(calls, list)
        assert errors, text[:40]
