"""Decoder properties: KV-cache decode == full forward, packing, chunked log-probs,
pure-function API, remat. Expectations come from the full (uncached, unpacked,
unchunked) forward of the same model, which test_parity ties to transformers."""

from __future__ import annotations

import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from marljax.models import (
    ModelConfig,
    abstract_model,
    forward,
    get_params,
    init_cache,
    init_model,
    positions_from_mask,
    set_params,
    token_logprobs,
)
from marljax.models.decoder import fuse_projections
from marljax.testing import random_model

fwd = jax.jit(forward, static_argnames="config")
logprobs = jax.jit(token_logprobs, static_argnames=("config", "chunk_size"))


def _model(preset="tiny-qwen2", seed=0, **changes):
    cfg = ModelConfig.preset(preset, **changes)
    return random_model(cfg, seed=seed), cfg


def _left_padded(B=3, T=8, pads=(0, 2, 5), seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 512, size=(B, T))
    mask = np.ones((B, T), bool)
    for b, n in enumerate(pads):
        mask[b, :n] = False
        ids[b, :n] = 0
    return jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-qwen3"])  # untied+bias, tied+qk-norm
def test_prefill_then_decode_equals_full_forward(preset):
    model, cfg = _model(preset)
    params = get_params(model)
    ids, mask = _left_padded(T=10)
    pos = positions_from_mask(mask)
    full, _ = fwd(params, ids, config=cfg, positions=pos, attention_mask=mask)

    step = jax.jit(lambda *a, **k: forward(*a, **k), static_argnames="config")  # own jit cache
    P, S = 6, 16  # prompt length, cache slots (> sequence: unused slots must not matter)
    cache = init_cache(cfg, ids.shape[0], S)
    logits, cache = step(
        params, ids[:, :P], config=cfg, positions=pos[:, :P], attention_mask=mask[:, :P], cache=cache
    )
    outs = [logits]
    for t in range(P, ids.shape[1]):  # one token at a time: static shapes, one compile
        logits, cache = step(
            params,
            ids[:, t : t + 1],
            config=cfg,
            positions=pos[:, t : t + 1],
            attention_mask=mask[:, t : t + 1],
            cache=cache,
        )
        outs.append(logits)
    assert int(cache.index) == ids.shape[1]
    assert step._cache_size() == 2  # prefill shape + decode shape
    inc = jnp.concatenate(outs, axis=1)
    m = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(inc)[m], np.asarray(full)[m], atol=1e-5, rtol=0)
    assert float(jnp.abs(full[m]).std()) > 0.5


def test_packed_segments_equal_separate_sequences():
    model, cfg = _model("tiny-qwen3")
    params = get_params(model)
    a = jnp.asarray(np.random.RandomState(0).randint(3, 512, (1, 5)))
    b = jnp.asarray(np.random.RandomState(1).randint(3, 512, (1, 7)))
    la, _ = fwd(params, a, config=cfg)
    lb, _ = fwd(params, b, config=cfg)
    packed = jnp.concatenate([a, b], axis=1)
    seg = jnp.asarray([[1] * 5 + [2] * 7])
    pos = jnp.asarray([list(range(5)) + list(range(7))])
    lp, _ = fwd(params, packed, config=cfg, positions=pos, segment_ids=seg)
    np.testing.assert_allclose(lp[:, :5], la, atol=1e-5, rtol=0)
    np.testing.assert_allclose(lp[:, 5:], lb, atol=1e-5, rtol=0)
    # without segment ids the second sequence would see the first: a real difference
    lnoseg, _ = fwd(params, packed, config=cfg, positions=pos)
    assert float(jnp.abs(lnoseg[:, 5:] - lb).max()) > 1e-2


# untied / tied heads; a chunk size not dividing T, and one larger than T
@pytest.mark.parametrize("preset,chunk_size", [("tiny-qwen2", 4), ("tiny-qwen3", 64)])
def test_token_logprobs_equal_log_softmax_of_full_logits(preset, chunk_size):
    model, cfg = _model(preset)
    params = get_params(model)
    ids, mask = _left_padded(T=13)
    pos = positions_from_mask(mask)
    labels = jnp.roll(ids, -1, axis=1)
    temp = 0.7
    got = logprobs(
        params,
        ids,
        labels,
        config=cfg,
        positions=pos,
        attention_mask=mask,
        temperature=temp,
        chunk_size=chunk_size,
    )
    logits, _ = fwd(params, ids, config=cfg, positions=pos, attention_mask=mask)
    want = jnp.take_along_axis(jax.nn.log_softmax(logits / temp, -1), labels[..., None], -1)[..., 0]
    assert got.shape == ids.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    assert float(want.std()) > 0.3


def test_token_logprobs_gradient_matches_full_logits():
    model, cfg = _model("tiny-qwen2")
    params = get_params(model)
    ids, mask = _left_padded(T=9)
    pos = positions_from_mask(mask)
    labels = jnp.roll(ids, -1, axis=1)
    w = mask.astype(jnp.float32)

    def chunked(p):
        lp = token_logprobs(
            p, ids, labels, config=cfg, positions=pos, attention_mask=mask, temperature=1.3, chunk_size=4
        )
        return (lp * w).sum()

    def full(p):
        logits, _ = forward(p, ids, config=cfg, positions=pos, attention_mask=mask)
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits / 1.3, -1), labels[..., None], -1)[..., 0]
        return (lp * w).sum()

    g1, g2 = jax.jit(jax.grad(chunked))(params), jax.jit(jax.grad(full))(params)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_pure_api_and_nnx_split_merge_match_module_call():
    model, cfg = _model("tiny-llama")
    ids, mask = _left_padded()
    pos = positions_from_mask(mask)
    want, _ = nnx.jit(lambda m, *a: m(*a))(model, ids, pos, mask)

    got, _ = fwd(get_params(model), ids, config=cfg, positions=pos, attention_mask=mask)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)

    graphdef, state = nnx.split(model)

    @jax.jit
    def apply(state, ids, pos, mask):
        return nnx.merge(graphdef, state)(ids, pos, mask)[0]

    np.testing.assert_allclose(apply(state, ids, pos, mask), want, atol=1e-5, rtol=0)

    # set_params writes a plain dict (e.g. after an optimiser step) back into the module
    halved = jax.tree.map(lambda x: x * 0.5, get_params(model))
    set_params(model, halved)
    np.testing.assert_array_equal(model.layers.wq.get_value(), halved["layers"]["wq"])
    got2, _ = fwd(get_params(model), ids, config=cfg, positions=pos, attention_mask=mask)
    assert float(jnp.abs(got2 - want).max()) > 1e-2


def _remat_loss(p, c, ids, mask):
    return token_logprobs(p, ids, ids, config=c, attention_mask=mask).mean()


@pytest.mark.parametrize("remat", ["full", "save_qkv_proj", "dots", "minimal"])
def test_remat_changes_nothing_numerically(remat):
    model, cfg = _model("tiny-qwen3")
    params = get_params(model)
    ids, mask = _left_padded()
    grad = jax.jit(jax.grad(_remat_loss), static_argnums=1)
    g0 = grad(params, cfg, ids, mask)
    g1 = grad(params, cfg.replace(remat=remat), ids, mask)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def test_remat_policies_keep_less_from_none_to_full():
    """What the backward pass keeps (JAX's saved residuals): every policy keeps less than the one
    before it in none > minimal (weight matmuls + attention output) > dots (weight matmuls) >
    save_qkv_proj (q/k/v) > full (layer inputs), so each named policy really selects its tensors."""
    from jax._src.ad_checkpoint import saved_residuals

    model, cfg = _model("tiny-qwen3")
    params = get_params(model)
    ids, mask = _left_padded()
    kept = {}
    for remat in ("none", "minimal", "dots", "save_qkv_proj", "full"):
        c = cfg.replace(remat=remat)
        residuals = saved_residuals(lambda p, c=c: _remat_loss(p, c, ids, mask), params)
        kept[remat] = sum(math.prod(aval.shape) * aval.dtype.itemsize for aval, _ in residuals)
    sizes = list(kept.values())
    assert all(a > b for a, b in zip(sizes, sizes[1:])), kept


@pytest.mark.parametrize("remat", ["none", "full"])
def test_unrolled_layers_equal_scanned_layers(remat):
    """scan_layers=False runs the same layers in the same order: same logits, gradients and cache."""
    model, cfg = _model("tiny-qwen3", remat=remat)
    unrolled = cfg.replace(scan_layers=False)
    params = get_params(model)
    ids, mask = _left_padded()

    def loss(p, c):
        return token_logprobs(p, ids, ids, config=c, attention_mask=mask).mean()

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (l0, g0), (l1, g1) = grad(params, cfg), grad(params, unrolled)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    pos = positions_from_mask(mask)
    outs = [
        fwd(params, ids, config=c, positions=pos, attention_mask=mask, cache=init_cache(c, 3, 12))
        for c in (cfg, unrolled)
    ]
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert outs[1][1].k.shape == init_cache(cfg, 3, 12).k.shape  # layers stacked again


def test_init_model_gives_a_working_random_model():
    model = init_model(ModelConfig.preset("tiny-llama"), seed=3)
    logits, _ = fwd(get_params(model), jnp.ones((1, 4), jnp.int32), config=model.config)
    assert logits.shape == (1, 4, 512) and bool(jnp.isfinite(logits).all())
    assert float(jnp.abs(model.layers.wq.get_value()).std()) > 0  # not all zeros


def test_abstract_model_has_the_parameters_shapes_and_axes_without_arrays():
    cfg = ModelConfig.preset("tiny-qwen2")
    abstract = abstract_model(cfg)
    want = get_params(random_model(cfg))
    got = get_params(abstract)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert isinstance(a, jax.ShapeDtypeStruct) and (a.shape, a.dtype) == (b.shape, b.dtype)
    assert abstract.layers.wq.get_metadata()["logical_axes"] == ("layers", "embed", "q_heads", "head_dim")


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-qwen3"])  # q/k/v biases; q/k norm
def test_fused_projection_layout_gives_the_same_logits(preset):
    """`fuse_projections` changes the parameter layout, not the maths."""
    model, cfg = _model(preset)
    params = get_params(model)
    fused = {**params, "layers": fuse_projections(params["layers"])}
    assert {"wqkv", "w_gate_up"} <= set(fused["layers"]) and "wq" not in fused["layers"]
    assert ("bqkv" in fused["layers"]) == cfg.qkv_bias
    ids, mask = _left_padded()
    pos = positions_from_mask(mask)
    want, _ = fwd(params, ids, config=cfg, positions=pos, attention_mask=mask)
    got, _ = fwd(fused, ids, config=cfg, positions=pos, attention_mask=mask)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_bad_shapes_are_clear_errors():
    model, cfg = _model()
    ids = jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match="positions"):
        model(ids, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="segment_ids.*cache"):
        forward(
            get_params(model),
            ids,
            config=cfg,
            segment_ids=jnp.zeros((2, 5), jnp.int32),
            cache=init_cache(cfg, 2, 8),
        )


def test_import_does_not_pull_torch():
    code = "import sys, marljax.models; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
