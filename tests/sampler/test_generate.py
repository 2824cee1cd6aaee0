"""End-to-end generation on tiny random checkpoints: greedy parity with transformers,
log-probs equal teacher forcing, stop conditions, seeds, shared prefill, no recompiles."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax import testing
from marljax.models import forward, from_pretrained, get_params, load_tokenizer, token_logprobs
from marljax.sampler import (
    Buckets,
    SamplingParams,
    Schedule,
    generate,
    generate_text,
    get_engine,
    truncation_mask,
)

# one checkpoint per family: Qwen2 (biases, untied), Qwen3 (q/k norm, tied, head_dim 32),
# Llama (llama3 rope scaling, GQA 1)
FAMILY_CASES = {"qwen2": "qwen2-untied-gqa2", "qwen3": "qwen3-tied-gqa2", "llama": "llama3rope-gqa1"}
MAX_NEW = 16


def _prompts(seed=0, lengths=(5, 2, 9)):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, 512, size=n).tolist() for n in lengths]


@functools.cache
def _torch_model(path):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()


# every family with the automatic (fused q/k/v, gate/up on small CPU models) decode step, and
# Llama with q/k/v/o biases, linear rope and tied embeddings through the unfused one
PARITY = [(FAMILY_CASES[f], None) for f in sorted(FAMILY_CASES)] + [("llama-linearrope-bias-tied", False)]


@pytest.mark.parametrize("case,fuse", PARITY)
def test_greedy_equals_transformers_generate_per_row(checkpoint, case, fuse):
    """Mixed prompt lengths in one batch; each row against transformers run on that
    row alone (no padding), EOS = <|im_end|> on both sides."""
    import torch

    path = checkpoint(case)
    model, _ = from_pretrained(path)
    prompts = _prompts(seed=1)
    out = generate(
        model,
        prompts,
        SamplingParams(MAX_NEW, temperature=0.0),
        eos_ids=[testing.EOS_ID],
        fuse_projections=fuse,
    )
    hf = _torch_model(path)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            g = hf.generate(
                torch.tensor([p]),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                eos_token_id=testing.EOS_ID,
                pad_token_id=testing.PAD_ID,
            )
        want = g[0, len(p) :].tolist()
        assert out.completions()[i] == want, f"row {i} (prompt length {len(p)})"
        assert out.finish_reason[i] == ("eos" if want[-1] == testing.EOS_ID else "length")
    assert len({tuple(c) for c in out.completions()}) == len(prompts)  # rows really differ


def _teacher_forced(params, config, prompts, out):
    """Per row: full-forward logits at every completion position and the log-probs
    of the completion tokens by `token_logprobs` (one right-padded batch)."""
    rows = [prompts[i] + out.completions()[r] for r, i in enumerate(out.prompt_index)]
    T = max(map(len, rows))
    ids = np.zeros((len(rows), T), np.int32)
    mask = np.zeros((len(rows), T), bool)
    for r, seq in enumerate(rows):
        ids[r, : len(seq)], mask[r, : len(seq)] = seq, True
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    labels = jnp.roll(ids, -1, axis=1)
    lp = jax.jit(token_logprobs, static_argnames=("config",))(
        params, ids, labels, config=config, attention_mask=mask
    )
    logits, _ = jax.jit(forward, static_argnames=("config",))(params, ids, config=config, attention_mask=mask)
    return np.asarray(lp), np.asarray(logits)


def test_logprobs_equal_teacher_forcing_for_sampled_tokens(qwen3):
    model, config, _ = qwen3
    params = get_params(model)
    prompts = _prompts(seed=2)
    temperature, top_k, top_p = 0.9, 40, 0.8
    out = generate(
        model,
        prompts,
        SamplingParams(MAX_NEW, temperature=temperature, top_p=top_p, top_k=top_k),
        n=2,
        seed=3,
        return_sampling_logprobs=True,
        eos_ids=(),
    )
    lp, logits = _teacher_forced(params, config, prompts, out)
    n_checked, truncation_visible = 0, 0
    for r, i in enumerate(out.prompt_index):
        L, n = len(prompts[i]), int(out.lengths[r])
        assert n == MAX_NEW and out.finish_reason[r] == "length"
        toks = out.tokens[r, :n]
        pos_logits = jnp.asarray(logits[r, L - 1 : L - 1 + n])
        # softmax(logits / T), no truncation: the trainer's convention
        want = jax.nn.log_softmax(pos_logits / temperature, axis=-1)[jnp.arange(n), toks]
        np.testing.assert_allclose(out.logprobs[r, :n], want, atol=1e-5, rtol=0)
        assert np.abs(out.logprobs[r, :n] - lp[r, L - 1 : L - 1 + n]).max() > 1e-3  # T = 0.9 is visible
        # sampling distribution: temperature, top-k, top-p applied, renormalised
        x, keep = truncation_mask(pos_logits, temperature=temperature, top_k=top_k, top_p=top_p)
        assert bool(keep[jnp.arange(n), toks].all()), "a token outside the nucleus was sampled"
        want = jax.nn.log_softmax(jnp.where(keep, x, -jnp.inf), axis=-1)[jnp.arange(n), toks]
        np.testing.assert_allclose(out.sampling_logprobs[r, :n], want, atol=1e-5, rtol=0)
        truncation_visible += int((np.abs(out.sampling_logprobs[r, :n] - out.logprobs[r, :n]) > 0.1).sum())
        n_checked += n
    assert n_checked == 6 * MAX_NEW and truncation_visible > n_checked // 2


def test_decode_over_growing_cache_windows_equals_the_whole_cache(qwen3):
    """Decode calls over windows of 16, 32, ... positions (chunks of 4 steps) give the tokens,
    ends and log-probs of decoding over the whole cache, with rows ending in different windows;
    log-probs also equal teacher forcing."""
    model, config, _ = qwen3
    params = get_params(model)
    prompts = _prompts(seed=8)
    kw = dict(n=2, seed=4, schedule=Schedule(chunk=4, idle_chunk=4, shrink=False))  # one slot count
    whole = Buckets(min_window=None)  # every window is the whole cache
    one_window = get_engine(config, buckets=whole)
    before = one_window.stats.decode_compiles
    ref = generate(model, prompts, SamplingParams(40), eos_ids=(), buckets=whole, **kw)
    eos = int(ref.tokens[1, 4])  # ends row 1 (at least) in the first window
    one = generate(model, prompts, SamplingParams(40), eos_ids=[eos], buckets=whole, **kw)
    assert one_window.stats.decode_compiles - before <= 1  # one slot count, one window: one program
    assert len(set(one.lengths.tolist())) >= 2 and one.lengths.max() > 20
    lp, _ = _teacher_forced(params, config, prompts, one)
    small = get_engine(config, buckets=Buckets(min_window=16))
    before = small.stats.decode_compiles
    out = generate(model, prompts, SamplingParams(40), eos_ids=[eos], buckets=Buckets(min_window=16), **kw)
    assert small.stats.decode_compiles - before >= 3  # windows of 16, 32 and 64 positions
    np.testing.assert_array_equal(out.tokens, one.tokens)
    np.testing.assert_array_equal(out.lengths, one.lengths)
    np.testing.assert_array_equal(out.finish_reason, one.finish_reason)
    for r, i in enumerate(out.prompt_index):
        L, n = len(prompts[i]), int(out.lengths[r])
        np.testing.assert_allclose(out.logprobs[r, :n], lp[r, L - 1 : L - 1 + n], atol=1e-5, rtol=0)


def test_rows_stop_independently_on_eos_and_stop_sequences(qwen3):
    model, _, _ = qwen3
    prompts = _prompts(seed=4)
    free = generate(model, prompts, SamplingParams(MAX_NEW, temperature=0.0), eos_ids=())
    G = free.tokens
    assert (free.finish_reason == "length").all() and (free.lengths == MAX_NEW).all()

    def first_end(row, seq):  # index after the first occurrence of seq in row, or None
        for s in range(len(row) - len(seq) + 1):
            if list(row[s : s + len(seq)]) == list(seq):
                return s + len(seq)
        return None

    eos = int(G[0, 3])
    stop = [int(t) for t in G[1, 5:7]]
    out = generate(
        model, prompts, SamplingParams(MAX_NEW, temperature=0.0), eos_ids=[eos], stop=[stop, [511, 510, 509]]
    )
    expected = []
    for r in range(len(prompts)):
        e, s = first_end(G[r], [eos]), first_end(G[r], stop)
        cands = [(e, "eos")] * (e is not None) + [(s, "stop")] * (s is not None) + [(MAX_NEW, "length")]
        end, why = min(cands, key=lambda c: (c[0], ["eos", "stop", "length"].index(c[1])))
        expected.append((end, why))
        assert out.lengths[r] == end and out.finish_reason[r] == why, (r, expected[-1])
        np.testing.assert_array_equal(out.tokens[r, :end], G[r, :end])
        assert (out.tokens[r, end:] == testing.PAD_ID).all() and (out.logprobs[r, end:] == 0).all()
    assert len({e for e, _ in expected}) >= 2, expected  # rows really ended at different steps

    # every row hits an EOS within 3 tokens -> decoding stops early
    stats = get_engine(model.config).stats
    steps = stats.decode_steps
    early = generate(
        model,
        prompts,
        SamplingParams(MAX_NEW, temperature=0.0),
        eos_ids=sorted({int(G[r, 2]) for r in range(len(prompts))}),
    )
    assert (early.finish_reason == "eos").all() and early.lengths.max() <= 3
    # the first token comes from the prefill's logits, each further one from a decode step
    assert stats.decode_steps - steps == early.lengths.max() - 1


def test_same_seed_same_tokens_and_n_samples_share_one_prefill(qwen3):
    model, config, _ = qwen3
    prompts = _prompts(seed=5)
    # prompts of 2-7 tokens: shared however short (the default waits for a second call only
    # for 16 tokens or more)
    kw = dict(eos_ids=(), schedule=Schedule(min_shared_prefix=1))
    nucleus = SamplingParams(MAX_NEW, top_p=0.95)
    stats = get_engine(config).stats
    before = (stats.insert_calls, stats.prefill_tokens, stats.shared_tokens)
    a = generate(model, prompts, nucleus, n=4, seed=11, **kw)
    # the first sample of each prompt prefills it; the other 3 copy all but its last token
    lengths = np.array([len(p) for p in prompts])
    assert stats.insert_calls - before[0] == 2
    assert stats.prefill_tokens - before[1] == lengths.sum() + 3 * 3
    assert stats.shared_tokens - before[2] == 3 * (lengths - 1).sum()
    assert stats.cache_bytes == get_engine(config).cache_bytes(16, 16 + 16)  # 12 samples -> 16 slots
    b = generate(model, prompts, nucleus, n=4, seed=11, **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    c = generate(model, prompts, nucleus, n=4, seed=12, **kw)
    assert (a.tokens != c.tokens).mean() > 0.5
    np.testing.assert_array_equal(a.prompt_index, np.repeat(np.arange(3), 4))
    # the 4 samples of a prompt differ from each other ...
    assert len({tuple(r) for r in a.tokens[:4]}) == 4
    # ... and equal prefilling each prompt 4 times (row r keeps its key either way)
    rep = generate(model, [p for p in prompts for _ in range(4)], nucleus, n=1, seed=11, **kw)
    np.testing.assert_array_equal(rep.tokens, a.tokens)
    np.testing.assert_allclose(rep.logprobs, a.logprobs, atol=1e-5)


def test_new_parameters_and_sampling_settings_do_not_recompile(qwen3):
    model, config, _ = qwen3
    params = get_params(model)
    engine = get_engine(config)
    prompts = _prompts(seed=6)
    # one program each for greedy calls, sampled calls, and sampled calls where some row truncates
    # (top-k or top-p); the settings' values are traced
    generate(model, prompts, SamplingParams(MAX_NEW, temperature=0.7, top_p=0.9), seed=0)
    generate(model, prompts, SamplingParams(MAX_NEW, temperature=0.7), seed=0)
    greedy = generate(
        model,
        prompts,
        SamplingParams(MAX_NEW, temperature=0.0),
    )
    compiles = engine.stats.compiles
    other = jax.tree.map(lambda x: x * 1.05 + 0.01, params)  # another agent's parameters
    other_greedy = generate(model, prompts, SamplingParams(MAX_NEW, temperature=0.0), params=other)
    assert (other_greedy.tokens != greedy.tokens).any()
    for sampling, kw in [
        (SamplingParams(MAX_NEW, temperature=1.3, top_k=7), dict(seed=5)),
        (SamplingParams(MAX_NEW, temperature=0.5, top_p=0.5), dict(seed=9)),
        (SamplingParams(9), {}),
        (SamplingParams(MAX_NEW, temperature=0.2), dict(params=other)),
    ]:
        generate(model, _prompts(seed=7, lengths=(3, 12, 7)), sampling, **kw)  # other lengths, same bucket
    assert engine.stats.compiles == compiles
    # the config's own model with params passed separately: same engine, no compile either
    again = generate(
        config,
        prompts,
        SamplingParams(MAX_NEW, temperature=0.0),
        params=params,
    )
    np.testing.assert_array_equal(again.tokens, greedy.tokens)
    assert engine.stats.compiles == compiles


def test_generate_text_through_the_chat_template(qwen3):
    model, _, path = qwen3
    tok = load_tokenizer(path)
    prompts = [
        "hello agents",
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 1 + 1?"}],
    ]
    res = generate_text(
        model,
        tok,
        prompts,
        SamplingParams(MAX_NEW, temperature=0.0),
    )
    assert res.prompts[0] == "<|im_start|>user\nhello agents<|im_end|>\n<|im_start|>assistant\n"
    assert res.prompts[1].startswith("<|im_start|>system\nbe brief<|im_end|>")
    ids = [tok.encode(p, add_special_tokens=False) for p in res.prompts]
    direct = generate(model, ids, SamplingParams(MAX_NEW, temperature=0.0), eos_ids=[testing.EOS_ID])
    np.testing.assert_array_equal(res.output.tokens, direct.tokens)
    for text, row, n in zip(res.texts, direct.tokens, direct.lengths):
        toks = [t for t in row[:n].tolist() if t != testing.EOS_ID]
        assert isinstance(text, str) and text == tok.decode(toks, skip_special_tokens=True)
    raw = generate_text(
        model,
        tok,
        ["hello agents"],
        SamplingParams(4, temperature=0.0),
        chat=False,
    )
    assert raw.prompts == ["hello agents"] and len(raw.texts) == 1


def test_bad_arguments_are_clear_errors(qwen3):
    model, config, _ = qwen3
    for kw, match in [
        (dict(prompt_ids=[[1, 2], []]), "prompt 1 is empty"),
        (dict(prompt_ids=[[1, 600]]), "outside"),
        (dict(n=0), "n must"),
        (dict(sampling=[SamplingParams(4)] * 2), "one per prompt"),  # 1 prompt, 2 settings
        (dict(sampling=[4]), "one per prompt"),
    ]:
        args = {"prompt_ids": [[1, 2, 3]], "sampling": SamplingParams(4), **kw}
        with pytest.raises(ValueError, match=match):
            generate(model, args.pop("prompt_ids"), args.pop("sampling"), **args)
    for bad, match in [
        (dict(top_p=0.0), "top_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-2), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**{"max_new_tokens": 4, **bad})
    with pytest.raises(ValueError, match="params"):
        generate(
            config,
            [[1, 2]],
            SamplingParams(2),
        )
    for bad in (dict(slots=0), dict(chunk=0), dict(refill_fraction=0.0), dict(min_slots=0)):
        with pytest.raises(ValueError, match="schedule"):
            Schedule(**bad)
