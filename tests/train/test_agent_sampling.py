"""Per-agent sampling settings (`agents.<name>.sampling`, `eval_sampling`) resolve over the run's
`sampler` block, reach the sampler (budget, greedy vs sampled, stop strings) and the trainer (each
sample's own temperature for its log-probs); adapter policies on one base sample in one call."""

from __future__ import annotations

import numpy as np
import pytest

from marljax.train.config import PolicyConfig, RunConfig, SamplerConfig
from marljax.train.generation import PolicyGenerator
from marljax.train.policy import BaseStore, Policy
from marljax.workflows.base import Agent
from marljax.workflows.types import Rows

MODEL = {"preset": "tiny-qwen3", "seed": 3}


def run_config(**agents) -> RunConfig:
    return RunConfig.model_validate(
        {
            "policies": {"p": {"model": MODEL}},
            "agents": {name: {"policy": "p", **a} for name, a in agents.items()},
            "data": {"source": {"kind": "synthetic"}},
            "workflow": {"agent": next(iter(agents))},  # grpo trains one of them; the others only sample
            "sampler": {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 12, "stop": ["\n\n"]},
        }
    )


def test_settings_resolve_over_the_sampler_block():
    cfg = run_config(
        coder={"sampling": {"temperature": 0.6, "max_new_tokens": 5, "stop": ["END"]}},
        critic={"eval_sampling": {"top_k": 7}},
        plain={},
    )
    coder, critic, plain = (cfg.agent_sampling(n) for n in ("coder", "critic", "plain"))
    assert (coder.temperature, coder.top_p, coder.max_new_tokens, coder.stop) == (0.6, 0.95, 5, ("END",))
    assert plain == cfg.sampler and critic == cfg.sampler
    # evaluation: greedy by default (the run's eval_sampling), the agent's own keys still apply
    ev = cfg.agent_sampling("coder", evaluation=True)
    assert (ev.temperature, ev.max_new_tokens, ev.stop) == (0.0, 5, ("END",))
    ev = cfg.agent_sampling("critic", evaluation=True)
    assert (ev.temperature, ev.top_k, ev.max_new_tokens) == (0.0, 7, 12)
    with pytest.raises(ValueError, match="temprature"):
        run_config(a={"sampling": {"temprature": 0.5}})


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy("p", PolicyConfig.model_validate({"model": MODEL, "micro_batch_size": 8}))


def test_each_agent_samples_with_its_own_settings(policy):
    run = SamplerConfig(max_new_tokens=12, temperature=1.0)
    settings = {
        "greedy": run.model_copy(update={"temperature": 0.0, "max_new_tokens": 4}),
        "cool": run.model_copy(update={"temperature": 0.5, "max_new_tokens": 9}),
    }
    gen = PolicyGenerator({"p": policy}, run, agent_sampling=settings)
    greedy, cool, default = Agent("greedy", "p"), Agent("cool", "p"), Agent("default", "p")
    prompt = "def add(a, b):"
    out = gen.generate([(greedy, prompt), (cool, prompt), (default, prompt)], n=3, seed=1)
    assert {len(g.completion_ids) for g in out[0]} <= set(range(1, 5))
    assert max(len(g.completion_ids) for g in out[1]) <= 9
    assert max(len(g.completion_ids) for g in out[2]) <= 12
    assert [g.temperature for row in out for g in row] == [1.0] * 3 + [0.5] * 3 + [1.0] * 3
    # greedy rows: the argmax continuation, the same for every sample and as a greedy call alone
    assert len({tuple(g.completion_ids) for g in out[0]}) == 1
    alone = policy.sampler.generate(
        [policy.turns.encode_prompt(prompt)], n=1, seed=0, sampler=settings["greedy"]
    )
    np.testing.assert_array_equal(out[0][0].completion_ids, alone.tokens[0, : alone.lengths[0]])

    # the trainer: log-probs at each sample's own temperature equal the sampler's
    gens = out[1] + out[2]
    samples = Rows(
        [g.prompt_ids for g in gens],
        [g.completion_ids for g in gens],
        [g.logprobs for g in gens],
        advantage=1.0,
        policy="p",
        temperature=[g.temperature for g in gens],
    )
    batch = policy.learner.collate(samples)
    mask = np.asarray(batch["loss_mask"])
    np.testing.assert_allclose(
        np.asarray(policy.learner._logprobs(policy.params, batch))[mask],
        np.asarray(batch["sampling_logp"])[mask],
        atol=2e-5,
        rtol=0,
    )


def test_stop_strings_of_an_agent_end_its_completions(policy):
    run = SamplerConfig(max_new_tokens=16, temperature=1.0)
    # a stop string the tiny model emits often: its most frequent token in an unconstrained sample
    free = PolicyGenerator({"p": policy}, run).generate([(Agent("a", "p"), "x")], n=8, seed=2)[0]
    ids = np.concatenate([g.completion_ids for g in free])
    tok = policy.turns.tokenizer

    def round_trips(t):  # a token that is its own text's tokenisation can be named by a stop string
        return tok.encode(tok.decode([int(t)]), add_special_tokens=False) == [int(t)]

    counts = np.bincount(ids)
    common = next(int(t) for t in np.argsort(-counts, kind="stable") if counts[t] > 1 and round_trips(t))
    stop = tok.decode([common])
    gen = PolicyGenerator({"p": policy}, run, agent_sampling={"a": run.model_copy(update={"stop": (stop,)})})
    out = gen.generate([(Agent("a", "p"), "x")], n=8, seed=2)[0]  # the same call and seed as `free`
    assert any(g.finish_reason == "stop" for g in out)
    for g, f in zip(out, free):  # each row is the free row, cut after the first stop token
        hits = np.flatnonzero(f.completion_ids == common)
        want = f.completion_ids[: hits[0] + 1] if hits.size else f.completion_ids
        np.testing.assert_array_equal(g.completion_ids, want)
        assert g.finish_reason == ("stop" if hits.size else f.finish_reason)


def test_adapter_policies_on_one_base_sample_in_one_call():
    bases = BaseStore()
    cfg = {"model": MODEL, "lora": {"rank": 4, "alpha": 64}, "micro_batch_size": 8}
    team = {
        n: Policy(n, PolicyConfig.model_validate({**cfg, "lora": {**cfg["lora"], "seed": i}}), bases=bases)
        for i, n in enumerate(("x", "y"))
    }
    for p in team.values():  # make the adapters differ from the base (b = 0 would equal it)
        p.update(
            Rows(
                [np.arange(3, 9)],
                [np.arange(9, 14)],
                [np.full(5, -4.0, np.float32)],
                advantage=1.0,
                agent=p.name,
            )
        )
    run = SamplerConfig(max_new_tokens=8, temperature=1.0)
    agents = [(Agent("ax", "x"), "def f():"), (Agent("ay", "y"), "def f():")]
    calls = []
    for p in team.values():  # count sampler calls
        original = p.sampler.generate
        p.sampler.generate = lambda *a, _o=original, **k: calls.append(1) or _o(*a, **k)
    together = PolicyGenerator(team, run).generate(agents, n=4, seed=3)
    assert len(calls) == 1
    x, y = together
    assert [g.policy for g in x] == ["x"] * 4 and [g.policy for g in y] == ["y"] * 4
    assert any(not np.array_equal(a.completion_ids, b.completion_ids) for a, b in zip(x, y))
    # each adapter alone, with its rows at the same request indices (their sampling keys)
    for j, (agent, text) in enumerate(agents):
        alone = PolicyGenerator({agent.policy: team[agent.policy]}, run).generate(
            [(agent, text)] * 2, n=4, seed=3
        )
        for a, b in zip(alone[j], together[j]):
            np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
