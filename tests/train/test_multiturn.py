"""Multi-turn trajectories as one sequence: continued prompts start with the earlier turn's exact
tokens, `merge_turns` joins the turns with the observation tokens masked, `collate` keeps them out
of the loss, and the trainer's loss gives them zero gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.models.chat import encode_continuation, encode_prompt
from marljax.models.tokenizer import make_tokenizer
from marljax.train import update
from marljax.train.batch import collate
from marljax.train.config import LossConfig
from marljax.workflows.types import Generation, Prompt, Rows, merge_turns


def gen(prompt_ids, completion_ids, logprobs=None, policy="p", finish="eos", text="", version=0):
    completion_ids = np.asarray(completion_ids, np.int32)
    if logprobs is None:
        logprobs = -np.arange(1, len(completion_ids) + 1, dtype=np.float32) / 10
    return Generation(
        text,
        np.asarray(prompt_ids, np.int32),
        completion_ids,
        np.asarray(logprobs, np.float32),
        finish,
        agent="a",
        policy=policy,
        version=version,
    )


def test_merge_by_hand():
    t0 = gen([1, 2], [3, 4], [-0.1, -0.2], text="x")
    t1 = gen([1, 2, 3, 4, 9, 9, 9], [5], [-0.5], text="y")
    t2 = gen([1, 2, 3, 4, 9, 9, 9, 5, 8], [6, 7], [-0.6, -0.7], text="z")
    m = merge_turns([t0, t1, t2])
    np.testing.assert_array_equal(m.prompt_ids, [1, 2])
    np.testing.assert_array_equal(m.completion_ids, [3, 4, 9, 9, 9, 5, 8, 6, 7])
    np.testing.assert_array_equal(m.completion_mask, [1, 1, 0, 0, 0, 1, 0, 1, 1])
    np.testing.assert_allclose(m.logprobs, [-0.1, -0.2, 0, 0, 0, -0.5, 0, -0.6, -0.7])
    assert m.text == "xyz" and m.finish_reason == t2.finish_reason
    assert merge_turns([t0]).completion_mask.all()


def test_merge_refuses_what_is_not_a_continuation():
    t0 = gen([1, 2], [3, 4])
    assert merge_turns([t0, gen([1, 2, 3, 5, 9], [6])]) is None  # the next prompt re-tokenized the answer
    assert merge_turns([t0, gen([1, 2, 3], [6])]) is None  # shorter than the earlier turn
    assert merge_turns([t0, gen([1, 2, 3, 4, 9], [6], policy="q")]) is None
    assert merge_turns([t0, gen([1, 2, 3, 4, 9], [6], version=1)]) is None
    with pytest.raises(ValueError):
        merge_turns([])


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def test_continued_chat_prompt_keeps_the_sampled_tokens(tok):
    first = Prompt("Q?", [("system", "Be brief."), ("user", "Q?")])
    ids0 = encode_prompt(tok, first, chat=True)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    # sampled tokens of the answer that a fresh tokenization would split differently: one per byte
    answer = "<tool_call>x</tool_call>"
    sampled = [i for ch in answer for i in tok(ch, add_special_tokens=False)["input_ids"]] + [im_end]
    g0 = gen(ids0, sampled, text=answer, finish="eos")
    nxt = first.continued(g0, "[calc] 4", "ignored raw", role="tool")
    ids1 = encode_continuation(tok, nxt, chat=True)
    assert ids1[: len(ids0) + len(sampled)] == ids0 + sampled
    # the same text as the template renders for the whole conversation
    whole = tok.apply_chat_template(
        [{"role": r, "content": c} for r, c in nxt.messages], add_generation_prompt=True, tokenize=False
    )
    assert tok.decode(ids1, skip_special_tokens=False) == whole
    # an answer cut by the length limit has no end-of-turn token: the markup adds it
    g_cut = gen(ids0, sampled[:-1], text=answer, finish="length")
    ids_cut = encode_continuation(tok, first.continued(g_cut, "[calc] 4", "r", role="tool"), chat=True)
    assert tok.decode(ids_cut, skip_special_tokens=False) == whole
    merged = merge_turns([g0, gen(ids1, [5, im_end])])
    assert merged is not None and (~merged.completion_mask).sum() == len(ids1) - len(ids0) - len(sampled)


def test_continued_raw_prompt_appends_the_new_text(tok):
    first = Prompt("Q: 2+2?\n", [("user", "Q: 2+2?")])
    ids0 = encode_prompt(tok, first, chat=False)
    g0 = gen(ids0, [70, 71], text="ab", finish="length")
    nxt = first.continued(g0, "obs", "Q: 2+2?\nab\nObservation: obs\n")
    assert nxt.continues.raw_tail == "\nObservation: obs\n"
    ids1 = encode_continuation(tok, nxt, chat=False)
    assert ids1 == ids0 + [70, 71] + tok("\nObservation: obs\n", add_special_tokens=False)["input_ids"]
    # raw text that does not extend the earlier prompt and answer cannot be continued token-wise
    assert encode_continuation(tok, first.continued(g0, "obs", "other text"), chat=False) is None


def test_collate_masks_the_observation_tokens():
    s = Rows([[1, 2]], [[3, 4, 9, 9, 5]], [np.zeros(5)], [[1, 1, 0, 0, 1]], reward=1.0, advantage=1.0)
    b = collate(s, micro_batch_size=1, length_multiple=8)
    # position t predicts token t + 1: completion tokens sit at 2..6, predicted at 1..5
    np.testing.assert_array_equal(b["loss_mask"][0, 0], [0, 1, 1, 0, 0, 1, 0, 0])
    assert Rows.from_json(s.to_json()).completion_mask[0].tolist() == [1, 1, 0, 0, 1]
    with pytest.raises(ValueError, match="one flag per completion token"):
        Rows([[1]], [[2, 3]], [np.zeros(2)], [[1]])


def test_masked_tokens_get_zero_gradient(monkeypatch):
    """The trainer's loss (`update.rl_loss`: PPO surrogate, entropy bonus, token-mean) as a function
    of the per-token log-probs: its gradient is zero exactly at the observation tokens."""
    s = Rows([[1, 2]], [[3, 4, 9, 9, 5]], [-0.3 * np.ones(5)], [[1, 1, 0, 0, 1]], reward=1.0, advantage=0.7)
    b = collate(s, micro_batch_size=1, length_multiple=8)
    mb = {k: jnp.asarray(v[0]) for k, v in b.items()}
    mb["old_logp"] = jnp.full(mb["labels"].shape, -0.3)

    def fake_logp(params, mb, config, with_entropy, temperature=True, lora_dropout=0.0):
        return params["logp"], params["logp"] ** 2  # an entropy that depends on the log-probs too

    monkeypatch.setattr(update, "_logp_entropy", fake_logp)
    loss_cfg = LossConfig(entropy_coef=0.1)
    logp = jnp.full(mb["labels"].shape, -0.25)
    grads = jax.grad(lambda p: update.rl_loss(p, mb, config=None, loss=loss_cfg, use_old_logp=True)[0])(
        {"logp": logp}
    )["logp"][0]
    trained = np.asarray(b["loss_mask"][0, 0])
    assert np.all(grads[~trained] == 0.0)
    assert np.all(np.abs(grads[trained]) > 1e-3)


def test_the_policy_continues_its_own_generations_only():
    """`Policy.encode_prompt` (what the trainer's generator calls) starts a continued prompt with the
    exact tokens of its own earlier turn; another policy's turn is re-encoded whole."""
    from marljax.train.config import PolicyConfig
    from marljax.train.policy import Policy

    policy = Policy("p", PolicyConfig.model_validate({"model": {"preset": "tiny-qwen3", "seed": 1}}))
    first = Prompt("Q?", [("user", "Q?")])
    ids0 = policy.turns.encode_prompt(first)
    sampled = [70, 71, 72, *policy.turns.eos_ids[:1]]
    text = policy.turns.tokenizer.decode(sampled, skip_special_tokens=True)
    mine = first.continued(gen(ids0, sampled, text=text, policy="p"), "obs", "raw", role="tool")
    ids = policy.turns.encode_prompt(mine)
    assert ids[: len(ids0) + len(sampled)] == ids0 + sampled
    theirs = first.continued(gen(ids0, sampled, text=text, policy="q"), "obs", "raw", role="tool")
    assert policy.turns.encode_prompt(theirs) == encode_prompt(policy.turns.tokenizer, theirs, chat=True)
    assert policy.turns.tokenizer.decode(ids) == policy.turns.tokenizer.decode(
        policy.turns.encode_prompt(theirs)
    )


def test_a_template_that_rewrites_the_answer_is_not_continued(tok):
    """A template that does not render the earlier answer verbatim (as Qwen3's strips reasoning)
    gives no continuation: the caller encodes the prompt whole, and the turns stay separate samples."""
    first = Prompt("Q?", [("user", "Q?")])
    g0 = gen(encode_prompt(tok, first, chat=True), [70, 71], text="<think>x</think>ok", finish="length")
    rewriting = make_tokenizer()
    rewriting.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{{ m['content'].split('</think>')[-1] if m['role'] == 'assistant' else m['content'] }}"
        "{{ '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    assert encode_continuation(rewriting, first.continued(g0, "obs", "raw", role="tool"), chat=True) is None
