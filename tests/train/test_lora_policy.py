"""Adapter policies (`lora:` in a policy's config): one frozen base in memory for every adapter on
it, updates that change the adapter alone with each policy's own optimiser and learning rate,
a KL reference that is the base itself, checkpoints and exact resume per adapter, and the
config's errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from marljax.train.checkpoint import RunCheckpointer
from marljax.train.config import PolicyConfig, RunConfig
from marljax.train.policy import BaseStore, Policy
from marljax.train.state import PolicyState
from marljax.workflows.types import Rows

MODEL = {"preset": "tiny-qwen3", "seed": 3}


def config(lr: float = 1e-3, **changes) -> PolicyConfig:
    # no clipping or weight decay: Adam's first step then moves each weight by lr (up to eps)
    return PolicyConfig.model_validate(
        {
            "model": MODEL,
            "lora": {"rank": 4, "alpha": 8, "targets": ["q", "v", "down"]},
            "micro_batch_size": 4,
            "optimizer": {"lr": lr, "weight_decay": 0.0, "max_grad_norm": None},
            **changes,
        }
    )


def samples(n: int = 4, seed: int = 0) -> Rows:
    rng = np.random.default_rng(seed)
    drawn = [(rng.integers(3, 200, 6), rng.integers(3, 200, 5), float(rng.normal())) for _ in range(n)]
    return Rows(
        [p for p, _, _ in drawn],
        [c for _, c, _ in drawn],
        [np.full(5, -4.0, np.float32)] * n,
        advantage=[a for _, _, a in drawn],
        policy="p",
    )


def host(tree):
    return jax.tree.map(np.array, tree)


def test_adapters_on_one_base_share_one_copy_of_its_weights():
    bases = BaseStore()
    team = [Policy(f"a{i}", config(lora={"rank": 2 + i, "alpha": 4}), bases=bases) for i in range(3)]
    full = Policy("full", PolicyConfig.model_validate({"model": MODEL}))
    n_leaves = len(jax.tree.leaves(full.params))
    buffers = {x.unsafe_buffer_pointer() for p in team for x in jax.tree.leaves(p.learner.frozen)}
    assert len(bases) == 1
    assert len(buffers) == n_leaves  # one buffer per base tensor, for the three policies together
    # the adapters are their own (and small): ranks 2, 3, 4 on q, v, down
    assert [p.params["wq"]["a"].shape[-1] for p in team] == [2, 3, 4]
    assert sum(x.size for x in jax.tree.leaves(team[0].params)) < 0.1 * sum(
        x.size for x in jax.tree.leaves(full.params)
    )


def test_an_update_changes_the_adapter_only_by_the_policy_own_learning_rate():
    bases = BaseStore()
    slow, fast = Policy("slow", config(1e-3), bases=bases), Policy("fast", config(3e-3), bases=bases)
    base_before, slow_before = host(slow.learner.frozen), host(slow.params)
    for p in (slow, fast):
        p.update(samples())
    # the base is the same arrays, untouched
    assert fast.learner.frozen is slow.learner.frozen
    for a, b in zip(jax.tree.leaves(slow.learner.frozen), jax.tree.leaves(base_before)):
        np.testing.assert_array_equal(np.asarray(a), b)
    # the optimiser state covers the adapter alone
    assert {x.shape for x in jax.tree.leaves(slow.state.opt_state) if x.ndim} == {
        x.shape for x in jax.tree.leaves(slow.params)
    }
    # b was 0: Adam's first step moves every entry of b with a gradient by about lr
    for p, lr in ((slow, 1e-3), (fast, 3e-3)):
        assert 0.9 * lr < float(np.abs(np.asarray(p.params["wq"]["b"])).max()) < 1.1 * lr
    # with b = 0 the gradient of a is exactly 0 (it flows through b), so a moves from step two on
    np.testing.assert_array_equal(np.asarray(slow.params["wq"]["a"]), slow_before["wq"]["a"])
    slow.update(samples(seed=1))
    assert float(np.abs(np.asarray(slow.params["wq"]["a"]) - slow_before["wq"]["a"]).max()) > 1e-4


def test_the_kl_reference_is_the_base_without_the_adapter():
    bases = BaseStore()
    kl = {"reference": True, "loss": {"kl_coef": 0.1}}
    p = Policy("p", config(**kl), bases=bases)
    p.update(samples())  # the adapter moves; its reference stays the base
    batch = p.learner.collate(samples(seed=1))
    ref = p.learner._logprobs(p.learner.model_params(p.state.ref_params), batch)
    base = p.learner._logprobs(p.learner.frozen, batch)
    now = p.learner._logprobs(p.learner.model_params(p.params), batch)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(base))
    assert float(np.abs(np.asarray(now) - np.asarray(base)).max()) > 0


def test_checkpoint_and_exact_resume_per_adapter(tmp_path):
    def team():
        bases = BaseStore()
        return {n: Policy(n, config(lr), bases=bases) for n, lr in (("a", 1e-3), ("b", 2e-3))}

    straight = team()
    for step in range(2):
        for p in straight.values():
            p.update(samples(seed=step))

    first = team()
    for p in first.values():
        p.update(samples(seed=0))
    with RunCheckpointer(tmp_path, ["a", "b"], async_save=False) as ck:
        ck.save(1, {n: p.state.checkpoint() for n, p in first.items()}, {"step": 1})
    resumed = team()
    with RunCheckpointer(tmp_path, ["a", "b"], async_save=False) as ck:
        step, states, _ = ck.restore({n: p.state.restore_target() for n, p in resumed.items()})
    assert step == 1
    assert set(states["a"]) == {"params", "opt_state", "step", "version"}  # no base in the checkpoint
    for n, p in resumed.items():
        p.state = PolicyState.from_checkpoint(states[n])
        p.update(samples(seed=1))
        for x, y in zip(
            jax.tree.leaves(p.state.checkpoint()), jax.tree.leaves(straight[n].state.checkpoint())
        ):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _run(policies: dict) -> dict:
    return {
        "policies": policies,
        "agents": {"x": {"policy": next(iter(policies))}},
        "data": {"source": {"kind": "synthetic"}},
    }


def test_config_errors_name_the_key():
    lora = {"rank": 4}
    with pytest.raises(ValueError, match="base"):
        RunConfig.model_validate(_run({"a": {"base": "nope", "lora": lora}}))
    with pytest.raises(ValueError, match="base needs lora"):
        RunConfig.model_validate(_run({"m": {"model": MODEL}, "a": {"base": "m"}}))
    with pytest.raises(ValueError, match="exactly one of model, base"):
        RunConfig.model_validate(
            _run({"m": {"model": MODEL}, "a": {"model": MODEL, "base": "m", "lora": lora}})
        )
    with pytest.raises(ValueError, match="targets"):
        PolicyConfig.model_validate({"model": MODEL, "lora": {"targets": ["q", "attn"]}})
    with pytest.raises(ValueError, match="ranks"):
        PolicyConfig.model_validate({"model": MODEL, "lora": {"ranks": 4}})
    cfg = RunConfig.model_validate(_run({"m": {"model": MODEL}, "a": {"base": "m", "lora": lora}}))
    assert cfg.policy_model("a") == cfg.policies["m"].model


def test_memory_estimate_counts_the_adapter_and_each_base_once():
    from marljax.models import ModelConfig
    from marljax.models.lora import LoraSpec
    from marljax.train import memory

    c = ModelConfig.preset("qwen2.5-0.5b")
    spec = LoraSpec(rank=16, alpha=32)
    D, F, L = c.hidden_size, c.intermediate_size, c.num_layers
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    # per layer, rank x (in + out) for q, k, v, o, gate, up, down; float32
    adapter = 4 * L * 16 * ((D + q) + 2 * (D + kv) + (q + D) + 2 * (D + F) + (F + D))
    full = memory.estimate(c, micro_batch_size=2, seq_len=64)
    est = [memory.estimate(c, micro_batch_size=2, seq_len=64, lora=spec, base_key="b") for _ in range(4)]
    e = est[0]
    assert (e.params, e.optimizer, e.gradients, e.base) == (adapter, 2 * adapter, 2 * adapter, full.params)
    # resident: each adapter and its two moments (its gradients exist only while it updates), the
    # base once; transient: the larger of one update and the team's one sampling call
    transient = max(e.update, memory.sampling_bytes(est))
    assert e.update == 2 * adapter + e.activations + e.compute_copy
    assert memory.team_bytes(est) == 4 * 3 * adapter + full.params + transient
    # level 2 at rank 16: the resident state of a team grows by well under 10% of the base per agent
    assert (memory.team_bytes(est) - memory.team_bytes(est[:1])) / 3 < 0.10 * full.params
    # two bases (other keys) are two copies
    other = memory.estimate(c, micro_batch_size=2, seq_len=64, lora=spec, base_key="c")
    assert memory.team_bytes([e, other]) == 2 * 3 * adapter + 2 * full.params + max(
        e.update, memory.sampling_bytes([e])
    )
    # a sampler layout of their own: one more copy of the base (a quarter of it per device when split
    # four ways), shared like the base, not one per adapter
    split = memory.estimate(c, micro_batch_size=2, seq_len=64, sampler_mesh_shape={"tensor": 4})
    assert split.sampler_copy < full.params
    own = [
        memory.estimate(
            c, micro_batch_size=2, seq_len=64, lora=spec, base_key="b", sampler_mesh_shape={"tensor": 4}
        )
        for _ in range(4)
    ]
    assert own[0].sampler_copy == 0 and own[0].base == full.params + split.sampler_copy
    assert memory.team_bytes(own) == memory.team_bytes(est) + split.sampler_copy


def test_adapter_dropout_trains_reproducibly():
    bases = BaseStore()
    cfg = config(lora={"rank": 4, "alpha": 8, "dropout": 0.5})
    a, b = Policy("a", cfg, bases=bases), Policy("b", cfg, bases=bases)
    for p in (a, b):
        p.update(samples())
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):  # the masks come from the seeds
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    no_dropout = Policy("c", config(lora={"rank": 4, "alpha": 8}), bases=bases)
    no_dropout.update(samples())
    diff = np.abs(np.asarray(a.params["wv"]["b"]) - np.asarray(no_dropout.params["wv"]["b"])).max()
    assert diff > 0  # dropout changed the gradient


def test_a_team_call_stacks_its_adapters_once_per_update(monkeypatch):
    """Sampling the same team again reuses its stacked adapters; after one adapter's update the
    team call is rebuilt and equals that adapter sampled alone."""
    import marljax.train.sampling as sampling_module
    from marljax.train.config import SamplerConfig

    bases = BaseStore()
    team = [Policy(f"a{i}", config(lr=3e-2), bases=bases) for i in range(2)]
    calls = []
    real = sampling_module.stack_adapters
    # (an update and a policy alone stack their one adapter through the same function)
    monkeypatch.setattr(sampling_module, "stack_adapters", lambda a: calls.append(len(a)) or real(a))
    greedy = SamplerConfig(max_new_tokens=4, temperature=0.0)
    prompts, which = [[5, 9, 11], [7, 8, 9, 10]], [0, 1]

    def team_call():
        return team[0].sampler.generate(
            prompts, n=1, seed=0, sampler=greedy, team=[p.sampler for p in team], adapter=which
        )

    first = team_call()
    team_call()
    assert calls.count(2) == 1
    team[1].update(samples())
    updated = team_call()
    assert calls.count(2) == 2
    alone = team[1].sampler.generate(prompts[1:], n=1, seed=0, sampler=greedy)
    np.testing.assert_array_equal(updated.tokens[1], alone.tokens[0])
    np.testing.assert_allclose(updated.logprobs[1], alone.logprobs[0], atol=1e-5)
    # the update moved adapter 1's log-probs (so a stale stack would have shown)
    assert np.abs(np.asarray(updated.logprobs[1]) - np.asarray(first.logprobs[1])).max() > 1e-4
