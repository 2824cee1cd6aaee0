"""Reading tool calls in the Qwen (<tool_call>) and Llama 3.x (bare JSON) formats, and describing tools."""

from __future__ import annotations

import pytest

from marljax.envs.tool_calls import (
    ToolCall,
    format_tool_call,
    parse_tool_calls,
    template_supports_tools,
    tool_schema,
    tools_text,
)


def test_qwen_blocks_anywhere_in_the_text():
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "search", "arguments": {"query": "capital of Italy"}}\n</tool_call>\n'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.errors == ()
    assert parsed.calls == (
        ToolCall("search", {"query": "capital of Italy"}),
        ToolCall("calculator", {"expression": "2+2"}),
    )


def test_llama_json_call_with_and_without_python_tag():
    for text in (
        '{"name": "search", "parameters": {"query": "x"}}',
        '<|python_tag|>{"name": "search", "parameters": {"query": "x"}}',
    ):
        assert parse_tool_calls(text).calls == (ToolCall("search", {"query": "x"}),)


def test_arguments_written_as_a_json_string_are_read():
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert parse_tool_calls(text).calls == (ToolCall("f", {"a": 1}),)


def test_plain_answers_have_no_calls_and_no_errors():
    for text in ("The answer is 4.", "Use {x} as a placeholder", '{"answer": 4}', ""):
        parsed = parse_tool_calls(text)
        assert not parsed.attempted, text


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<tool_call>{not json}</tool_call>", "invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>["search"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "f", "arguments": {}}', "not closed"),
        ('{"name": "f", "parameters": {"q": }', "invalid JSON"),
    ],
)
def test_malformed_calls_are_errors_not_exceptions(text, reason):
    parsed = parse_tool_calls(text)
    assert parsed.calls == () and len(parsed.errors) == 1
    assert reason in parsed.errors[0]


def test_one_bad_block_does_not_drop_the_good_one():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>oops</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.calls == (ToolCall("a", {}),) and len(parsed.errors) == 1


def test_formatted_calls_parse_back():
    for style in ("qwen", "llama"):
        text = format_tool_call("search", {"query": "q"}, style)
        assert parse_tool_calls(text).calls == (ToolCall("search", {"query": "q"}),)
    with pytest.raises(ValueError, match="unknown tool call style"):
        format_tool_call("f", {}, "mistral")


def test_plain_text_description_lists_each_tool_and_the_format():
    search = tool_schema(
        "search", "Search passages.", {"type": "object", "properties": {"query": {"type": "string"}}}
    )
    calc = tool_schema("calc", "Add.", {"type": "object", "properties": {"a": {"type": "number"}, "b": {}}})
    assert tools_text([search, calc]) == (
        "Tools:\n- search(query: string): Search passages.\n- calc(a: number, b: any): Add.\n"
        'Call one as <tool_call>{"name": "search", "arguments": {...}}</tool_call>.'
    )


def test_template_support_is_read_from_the_template():
    class Tok:
        chat_template = (
            "{% if tools %}{{ tools }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
        )

    class Plain:
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

    assert template_supports_tools(Tok()) and not template_supports_tools(Plain())
    assert not template_supports_tools(object())


def test_every_family_call_style_reads_back():
    from marljax.models import families

    for family in families.FAMILIES.values():
        text = format_tool_call("f", {"a": 1}, style=family.chat.tool_call_style)
        assert parse_tool_calls(text).calls == (ToolCall("f", {"a": 1}),), family.model_type


@pytest.mark.parametrize(
    "body",
    [
        "[" * 1000 + "]" * 1000,  # nesting deeper than the JSON decoder's recursion
        '{"name": "x", "arguments": {"a": ' + "9" * 5000 + "}}",  # over Python's int-string limit
        '{"name": "x", "arguments": "' + "[" * 1000 + '"}',  # the same inside a string of arguments
    ],
)
def test_unreadable_json_is_an_error_not_an_exception(body):
    for text in (f"<tool_call>{body}</tool_call>", body if body.startswith("{") else "{" + body):
        parsed = parse_tool_calls(text)
        assert not parsed.calls


def test_lone_surrogate_escapes_become_replacement_characters():
    text = '<tool_call>{"name": "a\\ud800", "arguments": {"\\udc00k": "\\ud83d\\ude00 \\udfff"}}</tool_call>'
    (call,) = parse_tool_calls(text).calls
    assert call == ToolCall("a\ufffd", {"\ufffdk": "\U0001f600 \ufffd"})
    (call.name + str(call.arguments)).encode("utf-8")  # a tokenizer and a UTF-8 log take them
