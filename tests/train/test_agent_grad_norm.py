"""Per-agent gradient norms (`train.agent_grad_norms`): each equals the norm of the gradient of a batch
holding only that agent's samples, and asking for them leaves the update itself unchanged."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from marljax.train.batch import collate
from marljax.train.buffer import ExperienceBuffer
from marljax.train.config import PolicyConfig
from marljax.train.policy import Policy
from marljax.train.update import rl_loss
from marljax.workflows.types import Rows


def config(agg_mode: str) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "model": {"preset": "tiny-qwen3", "seed": 3},
            "micro_batch_size": 4,  # 7 samples: two micro-batches, one with a padding row
            "optimizer": {"lr": 1e-3, "max_grad_norm": None},
            "loss": {"agg_mode": agg_mode},
        }
    )


def samples() -> Rows:
    rng = np.random.default_rng(0)
    agents = ["a", "b", "a", "a", "b", "a", "b"]  # interleaved, so each micro-batch mixes agents
    drawn = [
        (rng.integers(3, 200, 5 + k % 3), rng.integers(3, 200, 3 + k % 4), float(rng.normal()))
        for k in range(len(agents))
    ]
    return Rows(
        [p for p, _, _ in drawn],
        [c for _, c, _ in drawn],
        [np.full(len(c), -4.0, np.float32) for _, c, _ in drawn],
        advantage=[a for _, _, a in drawn],
        agent=agents,
        policy="p",
    )


def by_hand(policy: Policy, mine: Rows) -> float:
    """The norm of the gradient of the loss of a batch of `mine` only, in one micro-batch."""
    batch = collate(mine, micro_batch_size=len(mine), pad_id=policy.turns.pad_id)
    mb = jax.tree.map(lambda x: x[0], batch)

    def loss(params):
        return rl_loss(params, mb, config=policy.config, loss=policy.learner.loss, use_old_logp=False)[0]

    grads = jax.grad(loss)(policy.params)
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in jax.tree.leaves(grads))))


@pytest.mark.slow
@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_each_agents_norm_is_the_gradient_norm_of_its_own_batch(agg_mode):
    data = samples()
    policy = Policy("p", config(agg_mode))
    expected = {a: by_hand(policy, data[np.array(data.agent) == a]) for a in ("a", "b")}
    metrics = policy.finish_update(policy.start_update(data, agents=("a", "b", "c")))
    for a in ("a", "b"):
        assert metrics[f"agent_grad_norm/{a}"] == pytest.approx(expected[a], rel=1e-4)
    assert "agent_grad_norm/c" not in metrics  # no samples of c in the batch: nothing reported
    fresh = Policy("p", config(agg_mode))
    assert fresh.learner.agent_grad_norms(fresh.state, data, ("a", "b")) == pytest.approx(expected, rel=1e-4)
    assert expected["a"] > 0 and expected["b"] > 0


@pytest.mark.slow
def test_the_diagnostic_does_not_change_the_update():
    plain, diagnosed = Policy("p", config("token-mean")), Policy("p", config("token-mean"))
    m_plain = plain.update(samples())
    m_diag = diagnosed.finish_update(diagnosed.start_update(samples(), agents=("a", "b")))
    for x, y in zip(jax.tree.leaves(plain.params), jax.tree.leaves(diagnosed.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert m_plain["grad_norm"] == m_diag["grad_norm"]
    assert not any(k.startswith("agent_grad_norm") for k in m_plain)


def test_trainer_reports_agent_grad_norms_only_when_asked():
    from marljax.train.loop import Trainer

    class Recording:
        version = 0

        def __init__(self):
            self.asked = []

        def start_update(self, batch, **kw):
            self.asked.append(kw.get("agents"))
            self.version += 1
            return kw.get("agents")

        @staticmethod
        def finish_update(agents):
            out = {"loss": 1.0, "skipped": 0.0}
            return out if agents is None else {**out, **{f"agent_grad_norm/{a}": 2.0 for a in agents}}

        sampler = types.SimpleNamespace(sync=lambda: None)  # one process: nothing to copy

    for enabled in (False, True):
        t = Trainer.__new__(Trainer)  # only the update routing, no models
        t.policies, t.buffers = {"p": Recording()}, {"p": ExperienceBuffer(2)}
        if enabled:
            t.grad_norm_agents = {"p": ("coder", "tester")}
        t.buffers["p"].add(samples()[:2])
        m = t.update_ready_policies()
        assert t.policies["p"].asked == [("coder", "tester") if enabled else None]
        assert ("agent/coder/grad_norm" in m) == enabled and ("agent/tester/grad_norm" in m) == enabled
        assert m["policy/p/loss"] == 1.0 and not any("agent_grad_norm" in k for k in m)
