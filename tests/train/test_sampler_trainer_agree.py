"""The trainer optimises the distribution the sampler samples from: at equal parameters the trainer's
log-probs of sampled tokens equal the sampler's, so TIS weights are 1 and the mismatch KL is 0, at any
temperature, top-k and top-p (log-probs under softmax(logits / T), untruncated, on both sides)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from marljax.models.decoder import forward
from marljax.train.config import PolicyConfig, SamplerConfig
from marljax.train.generation import PolicyGenerator
from marljax.train.policy import Policy
from marljax.train.update import rl_loss
from marljax.workflows.base import Agent
from marljax.workflows.types import Rows


@pytest.fixture(scope="module")
def policy() -> Policy:
    cfg = PolicyConfig.model_validate(
        {"model": {"preset": "tiny-qwen3", "seed": 3}, "micro_batch_size": 8, "loss": {"tis_cap": 2.0}}
    )
    return Policy("p", cfg)


def sampled(policy: Policy, temperature: float, top_p: float, top_k: int) -> Rows:
    sampler = SamplerConfig(max_new_tokens=10, temperature=temperature, top_p=top_p, top_k=top_k)
    agent = Agent("a", "p")
    gens = PolicyGenerator({"p": policy}, sampler).generate(
        [(agent, "def add(a, b):"), (agent, "print the sum of 2 and 3")], n=4, seed=7
    )
    rng = np.random.default_rng(0)
    flat = [g for row in gens for g in row]
    return Rows(
        [g.prompt_ids for g in flat],
        [g.completion_ids for g in flat],
        [g.logprobs for g in flat],
        advantage=[float(rng.normal()) for _ in flat],
        policy="p",
        temperature=[g.temperature for g in flat],
    )


@pytest.mark.parametrize("top_k", [0, 20])
@pytest.mark.parametrize("top_p", [0.8, 1.0])
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_trainer_logprobs_equal_the_samplers(policy, temperature, top_p, top_k):
    samples = sampled(policy, temperature, top_p, top_k)
    assert set(samples.temperature) == {temperature}
    batch = policy.learner.collate(samples)
    mask = np.asarray(batch["loss_mask"])
    sampler_lp = np.asarray(batch["sampling_logp"])[mask]
    trainer_lp = np.asarray(policy.learner._logprobs(policy.params, batch))[mask]
    np.testing.assert_allclose(trainer_lp, sampler_lp, atol=2e-5, rtol=0)

    # independently: full logits of one row, divided by T, no truncation
    prompt, completion = samples.prompt_ids[0], samples.completion_ids[0]
    ids = np.concatenate([prompt, completion])[None]
    logits = np.asarray(forward(policy.params, ids, config=policy.config)[0][0], np.float64)
    z = logits[len(prompt) - 1 : -1] / temperature
    want = z[np.arange(len(completion)), completion] - np.log(np.exp(z).sum(-1))
    np.testing.assert_allclose(samples.sampling_logprobs[0], want, atol=2e-5, rtol=0)

    loss = functools.partial(rl_loss, config=policy.config, loss=policy.learner.loss, use_old_logp=False)
    _, metrics = jax.jit(loss)(policy.params, jax.tree.map(lambda x: x[0], batch))
    assert abs(float(metrics["tis_weight_mean"]) - 1.0) < 1e-4
    assert abs(float(metrics["tis_mismatch_kl"])) < 1e-5


def test_tis_mode_and_veto_come_from_the_config(policy):
    from pydantic import ValidationError

    from marljax.train.config import LossConfig

    with pytest.raises(ValidationError, match="tis_veto: needs tis_cap"):
        LossConfig(tis_veto=0.1)
    assert LossConfig(tis_cap=2.0, tis_mode="mask", tis_veto=0.1).tis_mode == "mask"

    batch = jax.tree.map(lambda x: x[0], policy.learner.collate(sampled(policy, 1.0, 1.0, 0)))
    mask = np.asarray(batch["loss_mask"])
    rows = np.flatnonzero(mask.any(1))
    first = np.flatnonzero(mask[rows[0]])[0]
    # the sampler found one token of the first row e^3 times likelier than the trainer does
    batch["sampling_logp"] = batch["sampling_logp"].at[rows[0], first].add(3.0)

    def metrics(**tis):
        loss = policy.learner.loss.model_copy(update=tis)
        return jax.jit(functools.partial(rl_loss, config=policy.config, loss=loss, use_old_logp=False))(
            policy.params, batch
        )[1]

    assert float(metrics(tis_veto=0.1)["tis_frac_vetoed"]) == pytest.approx(1 / len(rows))
    assert float(metrics()["tis_frac_vetoed"]) == 0.0
    masked = metrics(tis_mode="mask")
    assert float(masked["tis_frac_masked"]) == pytest.approx(1 / mask.sum(), rel=1e-5)
    assert float(metrics()["tis_frac_masked"]) == 0.0
