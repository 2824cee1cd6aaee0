"""Training attention implementations (marljax.models.attention) against a float64 numpy reference
built from the definition (causal, real keys, same segment), on the real query positions.

cuDNN's argument set (is_causal + per-row lengths) runs here through XLA; splash through Pallas
interpret mode; the TPU programs are compiled ahead of time for a v5p topology (libtpu, no chip).
"""

from __future__ import annotations

import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.models import ModelConfig, abstract_model, get_params, token_logprobs
from marljax.models.attention import causal_attention, length_attention, splash_attention, splash_interpret
from marljax.testing import random_model

N, K, H = 4, 2, 16  # GQA: two query heads per kv head


def _reference(q, k, v, valid, segment_ids=None):
    """float64 attention: query t of row b, head n reads key s of kv head n // (N / K) when s <= t,
    key s is real and (with segment ids) in the query's segment."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, Nq, Hd = q.shape
    group = Nq // k.shape[2]
    seg = np.zeros((B, T), int) if segment_ids is None else np.asarray(segment_ids)
    out = np.zeros_like(q)
    for b in range(B):
        for t in range(T):
            keys = [s for s in range(t + 1) if valid[b, s] and seg[b, s] == seg[b, t]]
            if not keys:
                continue
            for n in range(Nq):
                scores = k[b, keys, n // group] @ q[b, t, n] / math.sqrt(Hd)
                p = np.exp(scores - scores.max())
                out[b, t, n] = (p / p.sum()) @ v[b, keys, n // group]
    return out


def _qkv(B, T, dtype, seed=0):
    rng = np.random.RandomState(seed)
    q, k, v = (rng.randn(B, T, n, H).astype(np.float32) for n in (N, K, K))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _valid(T, starts, ends):
    t = np.arange(T)
    return np.stack([(t >= a) & (t < e) for a, e in zip(starts, ends)])


def _close_on_valid(out, ref, valid, atol):
    out = np.asarray(out, np.float64)
    assert np.isfinite(out[valid]).all()
    np.testing.assert_allclose(out[valid], ref[valid], atol=atol, rtol=0)


# --------------------------------------------------------------------- cuDNN's arguments via XLA
@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_length_attention_equals_reference_on_right_padded_rows(dtype, atol):
    T = 12
    valid = _valid(T, [0, 0, 0, 0], [12, 7, 1, 0])  # full, padded, one token, empty
    q, k, v = _qkv(4, T, dtype)
    out = jax.jit(lambda q, k, v, m: length_attention(q, k, v, valid=m, implementation="xla"))(q, k, v, valid)
    ref = _reference(q, k, v, valid)
    _close_on_valid(out, ref, valid, atol)
    assert not np.asarray(out, np.float64)[~valid].any()  # pad queries are 0
    dense = causal_attention(q, k, v, valid=jnp.asarray(valid))  # the default path agrees as well
    _close_on_valid(dense, ref, valid, atol)


def test_length_attention_marks_rows_that_are_not_a_prefix():
    T = 8
    valid = _valid(T, [0, 3], [8, 8])  # row 1 is left-padded: no length expresses it
    q, k, v = _qkv(2, T, jnp.float32)
    out = np.asarray(length_attention(q, k, v, valid=jnp.asarray(valid), implementation="xla"))
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()


def test_length_attention_refuses_what_cudnn_cannot_do():
    q, k, v = _qkv(1, 8, jnp.bfloat16)
    valid = jnp.ones((1, 8), bool)
    with pytest.raises(ValueError, match="segment ids"):
        causal_attention(
            q, k, v, valid=valid, segment_ids=jnp.zeros((1, 8), jnp.int32), implementation="cudnn"
        )
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        causal_attention(*(x.astype(jnp.float32) for x in (q, k, v)), valid=valid, implementation="cudnn")
    with pytest.raises(ValueError, match="multiple of 8"):
        causal_attention(q[..., :12], k[..., :12], v[..., :12], valid=valid, implementation="cudnn")
    with pytest.raises(ValueError, match="unknown attention implementation"):
        causal_attention(q, k, v, valid=valid, implementation="flash")


# --------------------------------------------------------------------- splash (interpret mode)
def _splash_cases(T):
    """Rows: left-padded, right-padded, and packed (three segments, then right padding)."""
    valid = _valid(T, [5, 0, 0], [T, T - 9, T - 3])
    seg = np.zeros((3, T), np.int32)
    seg[2, T // 3 :] = 1
    seg[2, 2 * T // 3 :] = 2
    return valid, seg


@pytest.mark.parametrize(
    "T,dtype,atol",
    [(128, jnp.float32, 1e-5), (40, jnp.float32, 1e-5), (40, jnp.bfloat16, 3e-2)],  # T=40: padded to 128
)
def test_splash_equals_reference(T, dtype, atol):
    valid, seg = _splash_cases(T)
    q, k, v = _qkv(3, T, dtype)
    with splash_interpret(True):
        out = jax.jit(
            lambda *a: causal_attention(*a[:3], valid=a[3], segment_ids=a[4], implementation="splash")
        )(q, k, v, valid, seg)
    assert out.shape == q.shape and out.dtype == q.dtype
    _close_on_valid(out, _reference(q, k, v, valid, seg), valid, atol)


def test_splash_gradients_equal_xla():
    """The backward kernels (dq; dk, dv summed over each kv head's query heads) against XLA's."""
    T = 40
    valid, seg = _splash_cases(T)
    q, k, v = _qkv(3, T, jnp.float32, seed=1)
    w = jnp.asarray(np.random.RandomState(2).randn(3, T, N, H), jnp.float32) * valid[:, :, None, None]

    def loss(q, k, v, impl):
        return (causal_attention(q, k, v, valid=valid, segment_ids=seg, implementation=impl) * w).sum()

    with splash_interpret(True):
        got = jax.jit(jax.grad(lambda *a: loss(*a, "splash"), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda *a: loss(*a, None), argnums=(0, 1, 2))(q, k, v)
    for g, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=2e-5, rtol=0)


def test_splash_is_refused_on_gpu_platforms(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    q, k, v = _qkv(1, 8, jnp.float32)
    with pytest.raises(ValueError, match="TPU kernel"):
        splash_attention(q, k, v, valid=jnp.ones((1, 8), bool))


# --------------------------------------------------------------------- the whole decoder
def test_decoder_logprobs_and_gradients_with_splash_equal_xla():
    cfg = ModelConfig.preset("tiny-qwen3")
    params = get_params(random_model(cfg, seed=3))
    T = 24
    valid, seg = _splash_cases(T)
    rng = np.random.RandomState(4)
    ids = jnp.asarray(np.where(valid, rng.randint(3, cfg.vocab_size, (3, T)), 0))
    pos = jnp.asarray(np.maximum(np.cumsum(valid, 1) - 1, 0))

    def run(impl):
        c = ModelConfig.preset("tiny-qwen3", attention_impl=impl)

        def loss(p):
            lp = token_logprobs(
                p, ids, jnp.roll(ids, -1, 1), config=c, positions=pos, attention_mask=valid, segment_ids=seg
            )
            return (lp * valid).sum(), lp

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    with splash_interpret(True):
        (_, lp_splash), g_splash = run("splash")
    (_, lp_xla), g_xla = run(None)
    np.testing.assert_allclose(np.asarray(lp_splash)[valid], np.asarray(lp_xla)[valid], atol=1e-5, rtol=0)
    for a, b in zip(jax.tree.leaves(g_splash), jax.tree.leaves(g_xla)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------- TPU program, ahead of time
@pytest.mark.slow(seconds=70)  # two TPU compiles of a real-width model on the CPU
def test_tpu_program_with_splash_has_no_f32_scores():
    """value_and_grad of token_logprobs, 2 layers of Qwen2.5-0.5B's width (14 heads, 2 kv heads,
    head dim 64), bf16, T = 1024, compiled for 8 v5p chips (rows over fsdp, heads over tensor):
    XLA's attention holds f32 `[.., T, T]` scores, splash's program none (and calls the kernel)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu
    from jax.experimental import topologies

    from marljax.models import make_mesh, param_dict_shardings
    from marljax.models.sharding import activation_sharding, batch_sharding

    mesh = make_mesh(fsdp=4, tensor=2, devices=topologies.get_topology_desc("v5p:2x2x2", "tpu").devices)
    B, T = 4, 1024
    scores = re.compile(rf"f32\[[\d,]*\b{T},{T}\]")
    found = {}
    for impl in (None, "splash"):
        cfg = ModelConfig.preset(
            "qwen2.5-0.5b", num_layers=2, dtype="bfloat16", param_dtype="bfloat16", attention_impl=impl
        )
        shardings = param_dict_shardings(cfg, mesh)
        params = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            get_params(abstract_model(cfg)),
            shardings,
        )
        ids = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=batch_sharding(mesh))
        mask = jax.ShapeDtypeStruct((B, T), jnp.bool_, sharding=batch_sharding(mesh))

        def loss(p, ids, mask, cfg=cfg):
            return (
                token_logprobs(p, ids, jnp.roll(ids, -1, 1), config=cfg, attention_mask=mask) * mask
            ).sum()

        with activation_sharding(mesh):
            text = jax.jit(jax.value_and_grad(loss)).lower(params, ids, mask).compile().as_text()
        found[impl] = (set(scores.findall(text)), text.count("tpu_custom_call"))
    assert found[None][0] and found[None][1] == 0, found[None]
    assert not found["splash"][0], found["splash"][0]
    assert found["splash"][1] >= 3, found["splash"]  # forward, dq and dk/dv kernels
