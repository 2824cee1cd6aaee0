"""Tool calls in the formats instruct models are trained on, and tools described to them.

Calls are read from a completion's text in two forms:

* Qwen2.5 / Qwen3 (Hermes style): one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks anywhere in the text;
* Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole reply is one JSON object
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``.

A call that cannot be read is an error message for the agent, never an exception. Tools are
described to a model through the chat template's ``tools=`` argument (`tool_schema` gives the
OpenAI-style function schema both templates take); for a template without tool support (or raw
prompts) `tools_text` describes them in plain text with the Qwen call format.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


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
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg} at character {e.pos})"
    if not isinstance(obj, dict):
        return f"a call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return 'the object has no "name" string'
    args = obj.get(args_key, obj.get("arguments" if args_key == "parameters" else "parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f'"{args_key}" is a string that is not a JSON object'
    if not isinstance(args, dict):
        return f'"{args_key}" must be a JSON object, got {type(args).__name__}'
    return ToolCall(name, args)


def parse_tool_calls(text: str) -> ParsedCalls:
    """The tool calls in a completion (module doc); a reply without a call gives none and no error."""
    calls, errors = [], []
    blocks = _BLOCK.findall(text)
    if blocks:
        for body, close in blocks:
            if not close:
                errors.append("a <tool_call> block is not closed by </tool_call>")
                continue
            got = _call_from_json(body.strip(), "arguments")
            (calls if isinstance(got, ToolCall) else errors).append(got)
        return ParsedCalls(tuple(calls), tuple(errors))
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    # a Llama call is the whole reply; text that merely mentions braces is an answer, not a call
    if body.startswith("{") and body.endswith("}") and '"name"' in body:
        got = _call_from_json(body, "parameters")
        (calls if isinstance(got, ToolCall) else errors).append(got)
    return ParsedCalls(tuple(calls), tuple(errors))


def format_tool_call(name: str, arguments: Mapping[str, Any], style: str = "qwen") -> str:
    """A call as the model writes it: a ``<tool_call>`` block (qwen) or a bare JSON object (llama)."""
    if style == "qwen":
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(arguments)}) + "\n</tool_call>"
    if style == "llama":
        return json.dumps({"name": name, "parameters": dict(arguments)})
    raise ValueError(f"unknown tool call style {style!r}; known: qwen, llama")


def tool_schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The function schema chat templates take in ``tools=`` (`parameters` is a JSON schema)."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": dict(parameters)},
    }


def tools_text(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tools and the call format in plain text, for prompts without the template's tool support:
    one line per tool, ``name(argument: type, ...): description``, then an example call."""
    lines = ["Tools:"]
    for s in schemas:
        f = s.get("function", s)
        props = f.get("parameters", {}).get("properties", {})
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        lines.append(f"- {f['name']}({args}): {f.get('description', '')}")
    first = schemas[0].get("function", schemas[0]) if schemas else {"name": "tool"}
    lines.append(f'Call one as <tool_call>{{"name": "{first["name"]}", "arguments": {{...}}}}</tool_call>.')
    return "\n".join(lines)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads a ``tools`` variable (Qwen2.5/3, Llama 3.1+ do)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = " ".join(template.values())
    return re.search(r"\btools\b", template) is not None
