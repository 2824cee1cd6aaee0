"""Tool calls in the formats instruct models are trained on, and tools described to them.

Calls are read from a completion's text in two forms:

* Qwen2.5 / Qwen3 (Hermes style): one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks anywhere in the text;
* Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole reply is one JSON object
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``.

A call that cannot be read (bad JSON, nesting too deep, numbers too long) is an error message for
the agent, never an exception; strings come back without lone surrogates. Tools are
described to a model through the chat template's ``tools=`` argument (`tool_schema` gives the
OpenAI-style function schema both templates take); for a template without tool support (or raw
prompts) `tools_text` describes them in plain text with the Qwen call format. Those text formats
(and `format_tool_call`, a call as a model writes it) are `marljax.models.chat`'s; this module
reads calls back.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from marljax.models.chat import (  # noqa: F401 - the text formats, re-exported beside their parser
    LLAMA_PYTHON_TAG,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_STYLES,
    format_tool_call,
    template_supports_tools,
    tool_schema,
    tools_text,
)

_BLOCK = re.compile(f"{re.escape(TOOL_CALL_OPEN)}(.*?)({re.escape(TOOL_CALL_CLOSE)}|$)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedCalls:
    """The calls read from one completion, and a message for each call that could not be read."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def attempted(self) -> bool:
        return bool(self.calls or self.errors)


def _call_from_json(text: str, args_key: str) -> ToolCall | str:
    """A `ToolCall` from one JSON object, or the reason it is not one."""
    try:
        obj = _load_json(text)
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg} at character {e.pos})"
    except (ValueError, RecursionError) as e:  # e.g. an integer of 5,000 digits, nesting 1,000 deep
        return f"unreadable JSON ({type(e).__name__}: {str(e)[:120]})"
    if not isinstance(obj, dict):
        return f"a call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return 'the object has no "name" string'
    args = obj.get(args_key, obj.get("arguments" if args_key == "parameters" else "parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = _load_json(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return f'"{args_key}" is a string that is not a JSON object'
    if not isinstance(args, dict):
        return f'"{args_key}" must be a JSON object, got {type(args).__name__}'
    return ToolCall(name, args)


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")  # escaped or raw


def _load_json(text: str) -> Any:
    """``json.loads``, with lone surrogates (``"\\ud800"``, which no tokenizer or UTF-8 file takes)
    replaced by U+FFFD in every string and key."""
    obj = json.loads(text)
    if _SURROGATE.search(text):
        clean = re.sub("[\ud800-\udfff]", "\ufffd", json.dumps(obj, ensure_ascii=False))
        obj = json.loads(clean)
    return obj


def parse_tool_calls(text: str) -> ParsedCalls:
    """The tool calls in a completion (module doc); a reply without a call gives none and no error."""
    calls, errors = [], []
    blocks = _BLOCK.findall(text)
    if blocks:
        for body, close in blocks:
            if not close:
                errors.append("a <tool_call> block is not closed by </tool_call>")
                continue
            got = _call_from_json(body.strip(), TOOL_CALL_STYLES["qwen"])
            (calls if isinstance(got, ToolCall) else errors).append(got)
        return ParsedCalls(tuple(calls), tuple(errors))
    body = text.strip()
    if body.startswith(LLAMA_PYTHON_TAG):
        body = body[len(LLAMA_PYTHON_TAG) :].strip()
    # a Llama call is the whole reply; text that merely mentions braces is an answer, not a call
    if body.startswith("{") and body.endswith("}") and '"name"' in body:
        got = _call_from_json(body, TOOL_CALL_STYLES["llama"])
        (calls if isinstance(got, ToolCall) else errors).append(got)
    return ParsedCalls(tuple(calls), tuple(errors))
