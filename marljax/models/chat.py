"""Prompts as the model was trained to read them: chat messages through the tokenizer's chat template.

An instruct checkpoint expects its chat markup (`<|im_start|>user ... <|im_start|>assistant` for
Qwen, header tokens for Llama 3) and ends its turn with a turn-end token that its
`generation_config.json` lists as an end of sequence. `encode_prompt` gives the token ids of a
prompt either as raw text or as chat messages rendered with the template and the generation prompt;
the sampler is given exactly these ids and the trainer trains on exactly them. A prompt's `tools`
go to the template's `tools=` argument (Qwen2.5/3, Llama 3.1+), or, for a template that does not
read them, into the system turn as text.

The text formats of tool calls live here too (the call styles a family's model writes, tools
described in plain text); `marljax.envs.tool_calls` reads calls back with them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

CHAT_MODES = ("auto", "on", "off")

# ------------------------------------------------------------------ tool-call text formats
# Qwen2.5 / Qwen3 (Hermes style) wrap each call in these tags; Llama 3.1+ writes the whole reply
# as one JSON object, optionally after `LLAMA_PYTHON_TAG`.
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
LLAMA_PYTHON_TAG = "<|python_tag|>"
# call style -> the key of the call's arguments in its JSON object
TOOL_CALL_STYLES = {"qwen": "arguments", "llama": "parameters"}


def format_tool_call(name: str, arguments: Mapping[str, Any], style: str = "qwen") -> str:
    """A call as the model writes it: a ``<tool_call>`` block (qwen) or a bare JSON object (llama)."""
    if style not in TOOL_CALL_STYLES:
        raise ValueError(f"unknown tool call style {style!r}; known: {', '.join(TOOL_CALL_STYLES)}")
    body = json.dumps({"name": name, TOOL_CALL_STYLES[style]: dict(arguments)})
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}" if style == "qwen" else body


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
    example = f'{{"name": "{first["name"]}", "arguments": {{...}}}}'
    lines.append(f"Call one as {TOOL_CALL_OPEN}{example}{TOOL_CALL_CLOSE}.")
    return "\n".join(lines)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads a ``tools`` variable (Qwen2.5/3, Llama 3.1+ do)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = " ".join(template.values())
    return re.search(r"\btools\b", template) is not None


# ------------------------------------------------------------------ prompts


def use_chat(mode: str, tokenizer: Any, where: str) -> bool:
    """Whether prompts go through the chat template: `auto` when the tokenizer has one."""
    if mode not in CHAT_MODES:
        raise ValueError(f"{where}: chat must be one of {CHAT_MODES}, got {mode!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has_template:
        raise ValueError(f"{where}: chat is 'on' but the tokenizer has no chat template")
    return mode == "on" or (mode == "auto" and has_template)


def encode_prompt(tokenizer: Any, prompt: str, *, chat: bool, where: str = "prompt") -> list[int]:
    """Token ids of `prompt`: its raw text, or its chat messages (`prompt.messages`, else the text as
    one user turn) rendered with the chat template and the assistant's generation prompt. A
    template without a system role gets the system text at the start of the first user turn."""
    if not chat:
        return list(tokenizer(str(prompt))["input_ids"])
    messages = [{"role": r, "content": c} for r, c in getattr(prompt, "messages", (("user", str(prompt)),))]
    tools = [dict(t) for t in getattr(prompt, "tools", ())]
    if tools and not template_supports_tools(tokenizer):
        messages = _tools_in_text(messages, tools)
        tools = []
    try:
        return _render(tokenizer, messages, tools)
    except Exception as first:
        if messages[0]["role"] != "system" or len(messages) < 2:
            raise ValueError(f"{where}: the chat template failed to render ({first})") from first
        merged = [{"role": "user", "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}]
        try:
            return _render(tokenizer, merged + messages[2:], tools)
        except Exception as e:
            raise ValueError(f"{where}: the chat template failed to render ({e})") from e


def encode_continuation(
    tokenizer: Any, prompt: Any, *, chat: bool, where: str = "prompt"
) -> list[int] | None:
    """Token ids of a prompt that continues an earlier one of the same policy
    (`prompt.continues`, see `marljax.workflows.types.Prompt.continued`): the earlier prompt and
    completion exactly as sampled, then the new turn's tokens. With chat, the new turn is the text
    the template adds after the answer (its end-of-turn markup, the tool or user turn, the next
    generation prompt), found by rendering the conversation with and without the new turn; raw,
    it is the text the raw prompt adds. None when that cannot be told (a template that re-renders
    earlier turns differently), and the caller encodes the prompt whole."""
    after = prompt.continues
    if not chat:
        if after.raw_tail is None:
            return None
        return [*after.ids, *tokenizer(after.raw_tail, add_special_tokens=False)["input_ids"]]
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    tools = [dict(t) for t in prompt.tools]
    if tools and not template_supports_tools(tokenizer):
        messages, tools = _tools_in_text(messages, tools), []
    kwargs = dict(tools=tools or None, tokenize=False)
    try:
        head = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=False, **kwargs)
        full = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    except Exception as e:
        raise ValueError(f"{where}: the chat template failed to render ({e})") from e
    answer = messages[-2]["content"]
    end = head.rfind(answer) + len(answer)
    if not answer or end < len(answer) or not full.startswith(head):
        return None
    closing = head[end:]  # the template's end of the answer's turn, e.g. "<|im_end|>\n"
    if after.ended:  # the completion's last token already wrote the start of it
        eos = tokenizer.decode([after.ids[-1]], skip_special_tokens=False)
        if not closing.startswith(eos):
            return None
        closing = closing[len(eos) :]
    tail = closing + full[len(head) :]
    return [*after.ids, *tokenizer(tail, add_special_tokens=False)["input_ids"]]


def _render(tokenizer: Any, messages: list[dict], tools: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


def _tools_in_text(messages: list[dict], tools: list[dict]) -> list[dict]:
    """For a template without tool support: the tools described in the system turn (one is added
    when there is none) and tool results sent as user turns, which every template renders."""
    described = tools_text(tools)
    out = [{**m, "role": "user" if m["role"] == "tool" else m["role"]} for m in messages]
    if out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
    else:
        out.insert(0, {"role": "system", "content": described})
    return out


def generation_eos_ids(path: str | os.PathLike | None) -> list[int]:
    """`eos_token_id` of a checkpoint's `generation_config.json` (instruct models list their
    turn-end token there), as a list; empty without the file or the key. A file that cannot be
    read, or whose entry is not ids, is a `CheckpointError` naming the file and the key."""
    # imported here: the loader brings jax, which the rest of this module does without
    from marljax.models.hf_io import CheckpointError

    if path is None:
        return []
    file = os.path.join(os.fspath(path), "generation_config.json")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise CheckpointError(
            f"{file}: cannot read eos_token_id: {getattr(e, 'strerror', None) or e}"
        ) from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: cannot read eos_token_id: not a JSON object")
    eos = config.get("eos_token_id")
    values = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CheckpointError(f"{file}: eos_token_id: expected a token id or a list of them, got {eos!r}")
    return values


# ------------------------------------------------------------------ a policy's turn format
@dataclasses.dataclass(frozen=True)
class TurnFormat:
    """How one policy's turns are written as tokens: its tokenizer, whether prompts go through the
    chat template, the ids that end a turn and the pad id. `policy` names the policy: a prompt that
    continues this policy's own earlier turn (`Prompt.continues`) starts with that turn's exact tokens.
    """

    policy: str
    tokenizer: Any
    chat: bool
    eos_ids: tuple[int, ...]
    pad_id: int

    @classmethod
    def of(cls, policy: str, tokenizer: Any, *, chat: str, eos: Any, path: str | None) -> TurnFormat:
        """The format of `policy`: `chat` its mode (`use_chat`); `eos` the model config's EOS id(s),
        else the tokenizer's; then those of the model directory's `generation_config.json` (`path`):
        instruct models end a turn with a token (`<|im_end|>`, `<|eot_id|>`) listed there."""
        eos = tokenizer.eos_token_id if eos is None else eos
        ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
        pad = tokenizer.pad_token_id
        return cls(
            policy,
            tokenizer,
            use_chat(chat, tokenizer, f"policies.{policy}"),
            tuple(dict.fromkeys(ids + generation_eos_ids(path))),
            int(pad if pad is not None else 0),
        )

    def encode_prompt(self, prompt: str) -> list[int]:
        """The token ids the sampler gets for `prompt` (chat template or raw text)."""
        where = f"policies.{self.policy}"
        after = getattr(prompt, "continues", None)
        if after is not None and after.policy == self.policy:
            ids = encode_continuation(self.tokenizer, prompt, chat=self.chat, where=where)
            if ids is not None:
                return ids
        return encode_prompt(self.tokenizer, prompt, chat=self.chat, where=where)

    def encode_completion(self, text: str) -> list[int]:
        """The token ids of `text` written as this policy's turn: no BOS, ending with its first EOS id
        (a chat turn's end), as a completion it sampled to its end."""
        return [*self.tokenizer(text, add_special_tokens=False)["input_ids"], *self.eos_ids[:1]]
