"""The update step: packing, exact gradient accumulation, the NaN guard, SFT, buffers."""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from marljax.models.config import ModelConfig
from marljax.models.decoder import get_params, init_model, token_logprobs
from marljax.train.batch import collate, geometric_bucket
from marljax.train.buffer import ExperienceBuffer
from marljax.train.config import LossConfig, OptimizerConfig
from marljax.train.optim import applied_steps, make_optimizer, make_schedule
from marljax.train.update import accumulate, guarded_step, make_logprob_fn, make_update_fn, rl_loss, sft_loss
from marljax.workflows.types import Rows

CONFIG = ModelConfig.preset("tiny-qwen2", vocab_size=64)


def sample(prompt, completion, adv=0.0, version=0, policy="p", seed=0):
    """One training row."""
    rng = np.random.default_rng(seed)
    return Rows(
        [prompt],
        [completion],
        [-rng.random(len(completion)).astype(np.float32)],
        reward=adv,
        advantage=adv,
        policy=policy,
        version=version,
    )


def random_samples(n, seed=0):
    rng = np.random.default_rng(seed)
    return Rows.concatenate(
        [
            sample(
                rng.integers(3, 64, rng.integers(2, 6)),
                rng.integers(3, 64, rng.integers(1, 9)),
                adv=float(rng.normal()),
                seed=k,
            )
            for k in range(n)
        ]
    )


def test_collate_layout_by_hand():
    s = Rows.concatenate([sample([5, 6, 7], [8, 9], adv=1.5), sample([4], [3, 2, 1], adv=-1.0)])
    b = collate(s, micro_batch_size=4, pad_id=0, length_multiple=8)
    assert b["tokens"].shape == (1, 4, 8)
    np.testing.assert_array_equal(b["tokens"][0, 0], [5, 6, 7, 8, 9, 0, 0, 0])
    np.testing.assert_array_equal(b["labels"][0, 0], [6, 7, 8, 9, 0, 0, 0, 0])
    # position t predicts t + 1: completion tokens 8, 9 are predicted at positions 2, 3
    np.testing.assert_array_equal(b["loss_mask"][0, 0], [0, 0, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_mask"][0, 1], [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(b["sampling_logp"][0, 0, 2:4], s.sampling_logprobs[0])
    np.testing.assert_array_equal(b["advantages"][0], [1.5, -1.0, 0.0, 0.0])
    assert not b["loss_mask"][0, 2:].any() and not b["attention_mask"][0, 2:].any()  # filler rows


def test_collate_loss_positions_pick_completion_logprobs():
    """log-probs gathered at the loss mask equal teacher-forced log-probs of the completion."""
    params = get_params(init_model(CONFIG, seed=1))
    s = random_samples(3, seed=2)
    b = collate(s, micro_batch_size=3, length_multiple=4)
    mb = jax.tree.map(lambda x: jnp.asarray(x[0]), b)
    logp = np.asarray(
        token_logprobs(
            params,
            mb["tokens"],
            mb["labels"],
            config=CONFIG,
            positions=mb["positions"],
            attention_mask=mb["attention_mask"],
        )
    )
    for k, (prompt, completion) in enumerate(zip(s.prompt_ids, s.completion_ids)):
        ids = np.concatenate([prompt, completion])[None]
        ref = np.asarray(
            token_logprobs(params, jnp.asarray(ids), jnp.roll(jnp.asarray(ids), -1, 1), config=CONFIG)
        )
        P = len(prompt)
        np.testing.assert_allclose(logp[k][b["loss_mask"][0, k]], ref[0, P - 1 : -1], atol=1e-5)


@pytest.mark.parametrize(
    "loss_type, agg_mode",
    [("ppo", "token-mean"), ("gspo", "seq-mean-token-mean"), ("ppo", "seq-mean-token-sum-norm")],
)
def test_micro_batches_accumulate_to_the_full_batch_gradient(agg_mode, loss_type):
    params = get_params(init_model(CONFIG, seed=0))
    s = random_samples(6, seed=3)
    loss = LossConfig(
        type=loss_type, agg_mode=agg_mode, norm_constant=16.0, entropy_coef=0.01, kl_coef=0.1, tis_cap=2.0
    )
    fn = functools.partial(rl_loss, config=CONFIG, loss=loss, use_old_logp=True)
    out = {}
    for mb in (6, 2):  # one micro-batch of 6, or three of 2 with different token counts
        b = jax.tree.map(jnp.asarray, collate(s, micro_batch_size=mb, length_multiple=16))
        # the same per-row values whatever the micro-batch split (rows stay in order)
        b["old_logp"] = jnp.asarray(-np.random.default_rng(0).random(b["tokens"].shape), jnp.float32)
        b["ref_logp"] = b["old_logp"] - 0.1
        out[mb] = accumulate(fn, params, b, agg_mode)
    (l6, g6, m6), (l2, g2, m2) = out[6], out[2]
    np.testing.assert_allclose(l2, l6, rtol=1e-5, atol=1e-7)
    for a, c in zip(jax.tree.leaves(g2), jax.tree.leaves(g6)):
        # float32 sums in another order: near-zero entries differ by ~1e-6 of the leaf's scale;
        # a wrong micro-batch weighting would be off by a fraction of the scale itself
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5 * float(np.abs(c).max()))
    np.testing.assert_allclose(m2["entropy"], m6["entropy"], rtol=1e-5)


def test_geometric_buckets_pad_whole_micro_batches_that_change_nothing():
    assert [geometric_bucket(n) for n in (1, 2, 3, 4, 5, 7, 9, 13, 17, 25)] == [
        1,
        2,
        3,
        4,
        6,
        8,
        12,
        16,
        24,
        32,
    ]
    assert [geometric_bucket(n, 32) for n in (1, 33, 65, 97, 129, 200)] == [32, 64, 96, 128, 192, 256]
    params = get_params(init_model(CONFIG, seed=0))
    s = random_samples(9, seed=4)  # 5 micro-batches of 2 -> 6, the last one empty
    plain = jax.tree.map(jnp.asarray, collate(s, micro_batch_size=2, length_multiple=4))
    geo = jax.tree.map(jnp.asarray, collate(s, micro_batch_size=2, length_multiple=4, geometric=True))
    assert plain["tokens"].shape[:2] == (5, 2) and geo["tokens"].shape[:2] == (6, 2)
    assert geo["tokens"].shape[2] == geometric_bucket(plain["tokens"].shape[2], 4)
    assert not geo["loss_mask"][5].any()
    fn = functools.partial(rl_loss, config=CONFIG, loss=LossConfig(), use_old_logp=False)
    (lp, gp, mp), (lg, gg, mg) = (accumulate(fn, params, b, "token-mean") for b in (plain, geo))
    np.testing.assert_allclose(lg, lp, rtol=1e-5, atol=1e-7)
    for a, c in zip(jax.tree.leaves(gg), jax.tree.leaves(gp)):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-7)
    T = plain["tokens"].shape[2]
    old_plain, old_geo = (np.asarray(make_logprob_fn(CONFIG)(params, b)) for b in (plain, geo))
    mask = np.asarray(plain["loss_mask"])
    np.testing.assert_allclose(old_geo[:5, :, :T][mask], old_plain[mask], atol=1e-5)
    assert (old_geo[5] == 0).all()


def _opt():
    # clipping then AdamW (optax's default weight decay)
    return make_optimizer(OptimizerConfig(lr=1e-2, weight_decay=1e-4, max_grad_norm=1.0))


def test_nan_guard_skips_exactly_the_bad_update():
    params = get_params(init_model(CONFIG, seed=0))
    opt = _opt()
    update = make_update_fn(
        functools.partial(rl_loss, config=CONFIG, loss=LossConfig(), use_old_logp=False), opt, "token-mean"
    )
    good = random_samples(4, seed=5)
    bad = random_samples(4, seed=5)
    bad.advantage[2] = float("nan")
    state = opt.init(params)
    before = jax.tree.map(np.asarray, (params, state))
    p1, s1, m1 = update(params, state, jax.tree.map(jnp.asarray, collate(bad, micro_batch_size=2)))
    assert float(m1["skipped"]) == 1.0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves((p1, s1))):
        np.testing.assert_array_equal(a, b)  # parameters and the optimiser's state untouched
    assert int(applied_steps(s1)) == 0  # the skip is not counted as a step
    p2, s2, m2 = update(p1, s1, jax.tree.map(jnp.asarray, collate(good, micro_batch_size=2)))
    assert float(m2["skipped"]) == 0.0 and np.isfinite(float(m2["loss"]))
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before[0]), jax.tree.leaves(p2))]
    assert all(changed)
    assert int(applied_steps(s2)) == 1  # the schedule and adam counted only the good step


def test_a_nan_gradient_with_a_finite_loss_is_skipped_and_counted():
    params = get_params(init_model(CONFIG, seed=0))
    opt = _opt()

    def nan_gradient(p, mb):  # value 0; d sqrt(x) / dx at 0 is inf, times 0 is NaN
        return jnp.sqrt(jnp.sum(p["embed"] * 0.0)), {}

    update = make_update_fn(nan_gradient, opt, "token-mean")
    batch = jax.tree.map(jnp.asarray, collate(random_samples(2, seed=6), micro_batch_size=2))
    before = jax.tree.map(np.array, params)
    new, state, m = update(params, opt.init(params), batch)
    assert float(m["loss"]) == 0.0 and not np.isfinite(float(m["grad_norm"]))
    assert float(m["skipped"]) == 1.0 and int(applied_steps(state)) == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(new)):
        np.testing.assert_array_equal(a, b)


def test_the_lr_metric_is_the_rate_each_step_used():
    params = get_params(init_model(CONFIG, seed=0))
    cfg = OptimizerConfig(lr=1e-2, warmup_steps=4)  # 0, 2.5e-3, 5e-3, ... then 1e-2
    opt = make_optimizer(cfg)
    update = make_update_fn(functools.partial(sft_loss, config=CONFIG), opt, "token-mean", make_schedule(cfg))
    b = jax.tree.map(jnp.asarray, collate(random_samples(2, seed=8), micro_batch_size=2))
    state, lrs = opt.init(params), []
    for _ in range(3):
        params, state, m = update(params, state, b)
        lrs.append(float(m["lr"]))
    np.testing.assert_allclose(lrs, [0.0, 2.5e-3, 5e-3], rtol=1e-6)


@pytest.mark.parametrize("schedule", [{}, {"warmup_steps": 2}, {"schedule": "cosine", "decay_steps": 4}])
def test_bfloat16_parameters_get_bfloat16_updates_and_skips(schedule):
    opt = make_optimizer(OptimizerConfig(lr=1e-2, **schedule))
    params = {"w": jnp.ones(4, jnp.bfloat16)}
    updates, _ = opt.update({"w": jnp.full(4, 0.5, jnp.bfloat16)}, opt.init(params), params)
    assert updates["w"].dtype == jnp.bfloat16
    state = opt.init(params)
    new, kept, _, skipped = guarded_step(
        opt, params, state, {"w": jnp.full(4, jnp.nan, jnp.bfloat16)}, jnp.float32(0)
    )
    assert new["w"].dtype == jnp.bfloat16 and float(skipped) == 1.0 and (np.asarray(new["w"]) == 1).all()
    assert int(applied_steps(kept)) == 0


def test_bfloat16_parameters_train_through_the_compiled_step():
    """The gradient accumulator keeps the parameter dtype (a float32 micro-batch weight times
    bfloat16 gradients would make it float32 and the scan's carry would not type-check)."""
    config = dataclasses.replace(CONFIG, dtype="float32", param_dtype="bfloat16")
    params = get_params(init_model(config, seed=0))
    opt = make_optimizer(OptimizerConfig(lr=1e-2))
    fn = functools.partial(rl_loss, config=config, loss=LossConfig(), use_old_logp=False)
    update = make_update_fn(fn, opt, "token-mean")
    b = jax.tree.map(jnp.asarray, collate(random_samples(4, seed=9), micro_batch_size=2))  # 2 micro-batches
    new, _, m = update(params, opt.init(params), b)
    assert float(m["skipped"]) == 0.0 and np.isfinite(float(m["loss"]))
    assert {x.dtype for x in jax.tree.leaves(new)} == {jnp.dtype(jnp.bfloat16)}


def test_sft_lowers_the_nll_of_its_targets():
    params = get_params(init_model(CONFIG, seed=0))
    opt = optax.adam(1e-2)
    update = make_update_fn(functools.partial(sft_loss, config=CONFIG), opt, "token-mean")
    b = jax.tree.map(jnp.asarray, collate(random_samples(4, seed=7), micro_batch_size=4))
    state, nll = opt.init(params), []
    for _ in range(20):
        params, state, m = update(params, state, b)
        nll.append(float(m["nll"]))
    assert nll[0] > 3.0 and nll[-1] < 0.5 * nll[0]


def test_ppo_step_raises_logprob_of_positive_advantage_tokens():
    params = get_params(init_model(CONFIG, seed=0))
    opt = optax.sgd(0.5)
    fn = functools.partial(rl_loss, config=CONFIG, loss=LossConfig(), use_old_logp=False)
    update = make_update_fn(fn, opt, "token-mean")
    s = random_samples(2, seed=9)
    s.advantage[:] = 1.0, -1.0
    b = jax.tree.map(jnp.asarray, collate(s, micro_batch_size=2))
    mb = jax.tree.map(lambda x: x[0], b)

    def seq_logp(p):
        lp = token_logprobs(
            p,
            mb["tokens"],
            mb["labels"],
            config=CONFIG,
            positions=mb["positions"],
            attention_mask=mb["attention_mask"],
        )
        return np.asarray(jnp.sum(jnp.where(mb["loss_mask"], lp, 0.0), axis=1))

    before = seq_logp(params)
    new, _, _ = update(jax.tree.map(jnp.copy, params), opt.init(params), b)
    after = seq_logp(new)
    assert after[0] > before[0] and after[1] < before[1]


# --------------------------------------------------------------------- buffers
def test_buffer_take_is_fifo_and_keeps_leftovers():
    buf = ExperienceBuffer(threshold=3)
    buf.add(Rows.concatenate([sample([1], [2], adv=k) for k in range(7)]))
    assert buf.ready(0)
    first, stats = buf.take(0)
    assert first.advantage.tolist() == [0, 1, 2] and stats["buffer_left"] == 4
    second, _ = buf.take(0)
    assert second.advantage.tolist() == [3, 4, 5]
    assert len(buf) == 1 and not buf.ready(0)
    with pytest.raises(RuntimeError, match="fewer than its threshold 3"):
        buf.take(0)
    assert (buf.added, buf.taken, buf.dropped) == (7, 6, 0)


def test_buffer_drops_only_samples_past_max_staleness_and_counts_them():
    buf = ExperienceBuffer(threshold=2, max_staleness=1)
    buf.add(Rows.concatenate([sample([1], [2], version=v) for v in (0, 0, 1, 2, 3)]))
    assert buf.drop_stale(3) == 3  # versions 0, 0, 1 are more than 1 behind version 3
    batch, stats = buf.take(3)
    assert batch.version.tolist() == [2, 3] and stats["staleness_max"] == 1.0
    assert buf.dropped == 3


def test_buffer_state_round_trip_is_exact():
    buf = ExperienceBuffer(threshold=4)
    buf.add(random_samples(3, seed=1))
    state = buf.state_dict()
    import json

    other = ExperienceBuffer(threshold=4)
    other.load_state_dict(json.loads(json.dumps(state)))
    for column in ("sampling_logprobs", "completion_ids", "prompt_ids"):
        for a, b in zip(getattr(buf.rows, column), getattr(other.rows, column), strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(buf.rows.advantage, other.rows.advantage)
    np.testing.assert_array_equal(buf.rows.reward, other.rows.reward)


def test_skewed_rates_fast_policy_updates_while_slow_waits():
    """Policy "fast" gets 5 samples a step and "slow" 1; thresholds 4 and 3."""
    from marljax.train.loop import Trainer

    class Counting:
        def __init__(self):
            self.version, self.batches = 0, []

        def start_update(self, batch):
            self.batches.append(len(batch))
            self.version += 1
            return [len(batch)]

        @staticmethod
        def finish_update(pending):
            return {"loss": float(pending[0]), "skipped": 0.0}

        sampler = types.SimpleNamespace(sync=lambda: None)  # one process: nothing to copy

    t = Trainer.__new__(Trainer)  # only the buffer routing, no models
    t.policies = {"fast": Counting(), "slow": Counting()}
    t.buffers = {"fast": ExperienceBuffer(4), "slow": ExperienceBuffer(3)}
    updates = []
    for _ in range(6):
        t.buffers["fast"].add(Rows.concatenate([sample([1], [2], policy="fast") for _ in range(5)]))
        t.buffers["slow"].add(sample([1], [2], policy="slow"))
        m = t.update_ready_policies()
        updates.append((m["policy/fast/updates"], m["policy/slow/updates"]))
    # fast: 5, 10, 15, ... arrive; 4 per update -> cumulative floor(5 (k+1) / 4) updates
    assert [u[0] for u in updates] == [1, 1, 1, 2, 1, 1]
    assert [u[1] for u in updates] == [0, 0, 1, 0, 0, 1]
    assert t.policies["fast"].batches == [4] * 7 and t.policies["slow"].batches == [3, 3]
    assert m["policy/fast/loss"] == 4.0 and m["policy/slow/loss"] == 3.0  # read back after dispatch
    assert len(t.buffers["fast"]) == 30 - 28 and len(t.buffers["slow"]) == 0


def guarded_and_plain_agree(schedule: dict) -> bool:
    """Four guarded steps and four plain optax steps from the same start end bit for bit equal."""
    cfg = OptimizerConfig(lr=1e-2, weight_decay=1e-4, max_grad_norm=1.0, **schedule)
    opt = make_optimizer(cfg)
    params = get_params(init_model(CONFIG, seed=0))

    def guarded(params, state, grads):
        return guarded_step(opt, params, state, grads, jnp.float32(1.0))[:2]

    def plain(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    got, want = [], []
    for step, out in ((guarded, got), (plain, want)):
        step = jax.jit(step, donate_argnums=(0, 1))
        p, s = jax.tree.map(jnp.copy, params), opt.init(params)
        for k in range(4):
            p, s = step(p, s, jax.tree.map(lambda x, k=k: jnp.sin(x * (k + 1.5)), p))
        out += [np.asarray(x) for x in jax.tree.leaves(p)]
    return all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize(
    "schedule", [{}, {"warmup_steps": 2}, {"schedule": "cosine", "warmup_steps": 2, "decay_steps": 5}]
)
def test_a_finite_guarded_step_is_bit_for_bit_the_plain_optax_step(schedule):
    # The skip guard must not change a finite step in the last bit: runs stay reproducible across it.
    # (optax.apply_if_finite fails this: its lax.cond compiles the update apart from apply_updates.)
    # Bit for bit is a property of the code XLA generates, so it is checked under XLA's default CPU
    # code generation (no XLA_FLAGS), in a child process: under the suite's quicker settings
    # (tests/conftest.py) the two programs are fused differently and their results differ.
    code = (
        f"from test_update import guarded_and_plain_agree as f; raise SystemExit(0 if f({schedule!r}) else 3)"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    child = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(Path(__file__).parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
