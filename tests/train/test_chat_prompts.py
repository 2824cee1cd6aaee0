"""Chat prompts: an agent's prompt reaches the sampler (and the trainer) as the tokenizer's chat
template renders its messages, raw text when chat is off; EOS ids include generation_config.json's."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from marljax.models.chat import encode_prompt
from marljax.models.hf_io import CheckpointError
from marljax.models.tokenizer import make_tokenizer
from marljax.testing import write_random_checkpoint
from marljax.train.config import PolicyConfig, SamplerConfig
from marljax.train.generation import PolicyGenerator
from marljax.train.policy import Policy
from marljax.train.sft import pair_samples
from marljax.workflows.base import Agent
from marljax.workflows.types import Prompt

CODER = Agent("coder", "p", role="You write Python.\n", template="{role}{problem}")


def policy(chat: str = "auto", path=None, name: str = "p") -> Policy:
    model = {"preset": "tiny-qwen3", "seed": 1} if path is None else {"path": str(path)}
    return Policy(name, PolicyConfig.model_validate({"model": model, "chat": chat}))


@pytest.fixture(scope="module")
def chat_policy() -> Policy:
    return policy("auto")


def test_a_prompt_is_its_raw_text_and_its_chat_messages():
    prompt = CODER.render("Add two numbers.")
    assert prompt == "You write Python.\nAdd two numbers."  # raw text unchanged
    assert prompt.messages == (("system", "You write Python."), ("user", "Add two numbers."))
    no_role = Agent("a", "p", template="Task: {problem}").render("x")
    assert no_role.messages == (("user", "Task: x"),)
    later = prompt.continued("return a - b", "It fails add(1, 2).", text="raw")
    assert later == "raw"
    assert later.messages[1:] == (
        ("user", "Add two numbers."),
        ("assistant", "return a - b"),
        ("user", "It fails add(1, 2)."),
    )
    with pytest.raises(ValueError, match="user or tool turn"):
        Prompt("x", [("user", "x"), ("assistant", "y")])


def test_chat_prompts_are_the_chat_template_with_the_generation_prompt(chat_policy):
    tok = chat_policy.turns.tokenizer
    assert chat_policy.turns.chat
    ids = chat_policy.turns.encode_prompt(CODER.render("Add two numbers."))
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Add two numbers."},
    ]
    assert ids == tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    want = (
        "<|im_start|>system\nYou write Python.<|im_end|>\n"
        "<|im_start|>user\nAdd two numbers.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.decode(ids, skip_special_tokens=False) == want
    # a plain string is one user turn
    assert tok.decode(chat_policy.turns.encode_prompt("hi"), skip_special_tokens=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_off_tokenizes_the_raw_text():
    # YAML 1.1 reads `chat: off` as false
    for value, mode in ((False, "off"), (True, "on")):
        assert PolicyConfig.model_validate({"model": {"preset": "tiny-qwen3"}, "chat": value}).chat == mode
    raw = policy("off")
    prompt = CODER.render("Add two numbers.")
    assert not raw.turns.chat
    assert raw.turns.encode_prompt(prompt) == raw.turns.tokenizer(str(prompt))["input_ids"]


def test_chat_on_needs_a_template(tmp_path):
    path = write_random_checkpoint(tmp_path / "m", "qwen3")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    for f in path.glob("chat_template.*"):
        f.unlink()
    assert not policy("auto", path).turns.chat  # auto: raw text without a template
    with pytest.raises(ValueError, match=r"policies\.p: chat is 'on' but the tokenizer has no chat template"):
        policy("on", path)


def test_a_template_without_a_system_role_gets_the_role_in_the_user_turn():
    tok = make_tokenizer()
    tok.chat_template = (
        "{%- for m in messages %}{%- if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
        "{%- endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{{ '<|im_start|>assistant\\n' }}"
    )
    ids = encode_prompt(tok, CODER.render("Add."), chat=True)
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>user\nYou write Python.\n\nAdd.<|im_end|>\n<|im_start|>assistant\n"
    )
    tok.chat_template = "{{ raise_exception('broken') }}"
    with pytest.raises(ValueError, match=r"policies\.q: the chat template failed to render"):
        encode_prompt(tok, CODER.render("Add."), chat=True, where="policies.q")


def test_the_sampler_and_sft_get_the_chat_ids(chat_policy):
    prompt = CODER.render("Add two numbers.")
    gens = PolicyGenerator({"p": chat_policy}, SamplerConfig(max_new_tokens=4)).generate(
        [(CODER, prompt)], 2, 0
    )
    want = chat_policy.turns.encode_prompt(prompt)
    for g in gens[0]:
        np.testing.assert_array_equal(g.prompt_ids, want)
    rows = pair_samples([(prompt, "return a + b")], CODER, chat_policy)
    assert len(rows) == 1
    np.testing.assert_array_equal(rows.prompt_ids[0], want)
    assert rows.completion_ids[0][-1] == chat_policy.turns.eos_ids[0] == 2  # <|im_end|> ends the turn


def test_generation_config_eos_ids_join_the_configs(tmp_path):
    path = write_random_checkpoint(tmp_path / "m", "qwen3")
    assert policy(path=path).turns.eos_ids == (2,)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert policy(path=path).turns.eos_ids == (2, 0)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(CheckpointError) as e:
        policy(path=path)
    assert str(e.value) == (
        f"policies.p.model.path: {path / 'generation_config.json'}: eos_token_id: "
        "expected a token id or a list of them, got 'x'"
    )


def test_a_tokenizer_larger_than_the_vocabulary_is_an_error(tmp_path):
    path = write_random_checkpoint(tmp_path / "m", "qwen3", tokenizer=False, vocab_size=100)
    make_tokenizer(path, vocab_size=320)
    with pytest.raises(
        ValueError, match=r"policies\.small\.model: .* 100 embeddings but its tokenizer .* 320"
    ):
        policy(path=path, name="small")


def test_a_cut_prompt_is_reported_once_per_agent(chat_policy, caplog):
    gen = PolicyGenerator({"p": chat_policy}, SamplerConfig(max_new_tokens=2), max_prompt_len=8)
    long = CODER.render("a long problem statement " * 4)
    with caplog.at_level(logging.WARNING, logger="marljax.train.generation"):
        gens = gen.generate([(CODER, long), (CODER, long)], 1, 0)
        gen.generate([(CODER, long)], 1, 1)
    ids = chat_policy.turns.encode_prompt(long)
    np.testing.assert_array_equal(gens[0][0].prompt_ids, ids[:2] + ids[-6:])  # the middle goes
    cut = [r for r in caplog.records if "was cut" in r.getMessage()]
    assert len(cut) == 1 and "'coder'" in cut[0].getMessage()
