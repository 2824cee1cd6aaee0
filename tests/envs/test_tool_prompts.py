"""Tools reach the model through the chat template's `tools=` argument where the template reads
them, and as text in the system turn where it does not; tool results are tool turns."""

from __future__ import annotations

import json
import pickle

import pytest

from marljax.envs.tools import calculator_tool
from marljax.models.chat import encode_prompt, tools_text
from marljax.models.tokenizer import make_tokenizer
from marljax.workflows.types import Prompt

# a ChatML template that lists the tools in the system turn, as Qwen2.5's does (written for this test)
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' }}"
    "\nTOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if not (tools and m['role'] == 'system') %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
SCHEMA = calculator_tool().schema


@pytest.fixture(scope="module")
def tokenizers():
    plain = make_tokenizer()
    with_tools = make_tokenizer()
    with_tools.chat_template = TOOLS_TEMPLATE
    return plain, with_tools


def prompt() -> Prompt:
    first = Prompt("raw", [("system", "Be brief."), ("user", "What is 2+2?")], [SCHEMA])
    return first.continued('<tool_call>{"name": "calculator"}</tool_call>', "[calculator] 4", "raw2", "tool")


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def test_template_with_tools_gets_them_through_tools_argument(tokenizers):
    _, tok = tokenizers
    text = decode(tok, encode_prompt(tok, prompt(), chat=True))
    assert text.startswith("<|im_start|>system\nBe brief.\nTOOLS:calculator;<|im_end|>\n")
    assert "<|im_start|>tool\n[calculator] 4<|im_end|>\n<|im_start|>assistant\n" in text
    assert "You can call these tools" not in text


def test_template_without_tools_gets_them_as_text(tokenizers):
    plain, _ = tokenizers
    text = decode(plain, encode_prompt(plain, prompt(), chat=True))
    assert text.startswith(f"<|im_start|>system\nBe brief.\n\n{tools_text([SCHEMA])}<|im_end|>\n")
    # tool results become a user turn, which every template renders
    assert "<|im_start|>user\n[calculator] 4<|im_end|>\n<|im_start|>assistant\n" in text
    no_system = Prompt("raw", [("user", "hi")], [SCHEMA])
    text = decode(plain, encode_prompt(plain, no_system, chat=True))
    assert text.startswith(f"<|im_start|>system\n{tools_text([SCHEMA])}<|im_end|>\n<|im_start|>user\nhi")


def test_raw_prompts_are_their_text(tokenizers):
    plain, _ = tokenizers
    assert decode(plain, encode_prompt(plain, prompt(), chat=False)) == "raw2"


def test_prompt_keeps_tools_and_pickles():
    p = prompt()
    assert p.tools == (SCHEMA,) and p.messages[-1] == ("tool", "[calculator] 4")
    back = pickle.loads(pickle.dumps(p))
    assert back == p and back.messages == p.messages and back.tools == p.tools
    assert json.dumps(back.tools)  # JSON-able, as templates need
    with pytest.raises(ValueError, match="user or tool turn"):
        Prompt("x", [("user", "x"), ("assistant", "y")])
