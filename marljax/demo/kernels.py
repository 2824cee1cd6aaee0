"""Kernel demonstration: a two-agent team learns a cooperative task with marljax's kernels.

`python -m marljax.demo.kernels` runs it in seconds (the embedded demo,
`python -m marljax.demo`, trains LLM agents). Each problem has a secret sequence; agent 0
(the proposer) writes one token per position and agent 1 (the reviser),
seeing the proposer's token, writes a correction. The team scores when
``(proposal + correction) % V`` equals the secret token; the proposer also
gets a small process reward for writing the problem's hint token. Policies
are tables of logits, so everything is pure JAX and runs in seconds on a CPU:
sampling, AT-GRPO / Dr. MAS credit, the PPO loss and an optax update.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marljax import kernels

VOCAB, LENGTH, PROBLEMS, GROUP = 6, 4, 4, 8


def init_policies(key):
    k0, k1 = jax.random.split(key)
    return {
        "proposer": 0.01 * jax.random.normal(k0, (PROBLEMS, LENGTH, VOCAB)),
        "reviser": 0.01 * jax.random.normal(k1, (PROBLEMS, LENGTH, VOCAB, VOCAB)),
    }


def task(seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, VOCAB, (PROBLEMS, LENGTH))), jnp.asarray(
        rng.integers(0, VOCAB, (PROBLEMS,))
    )


def rollout(params, secret, hint, key):
    """G joint samples per problem: tokens [P*G, L] per agent and per-agent rewards [P*G, 2]."""
    problems = jnp.repeat(jnp.arange(PROBLEMS), GROUP)
    k0, k1 = jax.random.split(key)
    proposal = jax.random.categorical(k0, params["proposer"][problems])
    reviser_logits = jnp.take_along_axis(params["reviser"][problems], proposal[..., None, None], axis=2)[
        :, :, 0
    ]
    correction = jax.random.categorical(k1, reviser_logits)
    joint = jnp.mean((proposal + correction) % VOCAB == secret[problems], axis=1)
    process = jnp.mean(proposal == hint[problems][:, None], axis=1)
    return problems, proposal, correction, jnp.stack([joint + 0.5 * process, joint], axis=1)


def agent_logits(params, problems, proposal):
    reviser = jnp.take_along_axis(params["reviser"][problems], proposal[..., None, None], axis=2)[:, :, 0]
    return params["proposer"][problems], reviser


def make_step(optimizer):
    @jax.jit
    def step(params, opt_state, secret, hint, key):
        problems, proposal, correction, rewards = rollout(params, secret, hint, key)
        agents = jnp.tile(jnp.arange(2), PROBLEMS * GROUP)
        groups = jnp.repeat(problems, 2)
        # Dr. MAS: each agent normalised with its own statistics inside each problem group.
        adv, metrics = kernels.dr_mas_advantages(
            rewards.reshape(-1), agents, 2, group_ids=groups, num_groups=PROBLEMS
        )
        adv = adv.reshape(-1, 2)

        def loss_fn(p):
            logits = agent_logits(p, problems, proposal)
            total = 0.0
            for i, tokens in enumerate((proposal, correction)):
                logp = kernels.logprobs_from_logits(logits[i], tokens)
                loss, _ = kernels.policy_loss(
                    logp, jax.lax.stop_gradient(logp), adv[:, i], jnp.ones_like(tokens, bool)
                )
                total = total + loss
            return total

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        stats = {
            "joint": rewards[:, 1].mean(),
            "proposer": rewards[:, 0].mean(),
            "amplification": metrics["amplification"],
        }
        return optax.apply_updates(params, updates), opt_state, stats

    return step


def show_estimators():
    """One batch through each estimator, to see how their groupings differ."""
    rewards = jnp.array([0.0, 1.0, 1.0, 0.0, 0.5, 0.9, 1.0, 0.8])
    agents = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    zeros = jnp.zeros(8, jnp.int32)
    rows = {
        "GRPO (one group)": kernels.grpo_advantages(rewards, zeros, 1),
        "Dr.GRPO": kernels.dr_grpo_advantages(rewards, zeros, 1),
        "RLOO": kernels.rloo_advantages(rewards, zeros, 1),
        "AT-GRPO (per agent)": kernels.at_grpo_advantages(
            rewards, zeros, zeros, agents, num_problems=1, num_turns=1, num_agents=2
        ),
        "Dr. MAS": kernels.dr_mas_advantages(rewards, agents, 2)[0],
    }
    print("rewards".ljust(22), np.array2string(np.asarray(rewards), precision=2))
    for name, adv in rows.items():
        print(name.ljust(22), np.array2string(np.asarray(adv), precision=2))
    phi = kernels.shapley_values(jnp.array([0.0, 0.2, 0.3, 1.0]))
    print("Shapley of v = [0, .2, .3, 1] (bit i = agent i):", np.asarray(phi))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    show_estimators()
    secret, hint = task(args.seed)
    params = init_policies(jax.random.key(args.seed))
    optimizer = optax.adam(0.1)
    opt_state = optimizer.init(params)
    step = make_step(optimizer)
    key = jax.random.key(args.seed + 1)
    start, history = time.time(), []
    print(
        f"\ntraining a proposer + reviser team for {args.steps} steps ({PROBLEMS} problems x {GROUP} samples)"
    )
    for i in range(args.steps):
        key, sub = jax.random.split(key)
        params, opt_state, stats = step(params, opt_state, secret, hint, sub)
        history.append(float(stats["joint"]))
        if i % 25 == 0 or i == args.steps - 1:
            amp = np.array2string(np.asarray(stats["amplification"]), precision=2)
            print(
                f"step {i:4d}  joint reward {history[-1]:.3f}  proposer reward {float(stats['proposer']):.3f}"
                f"  Dr. MAS amplification {amp}"
            )
    first, last = np.mean(history[:10]), np.mean(history[-10:])
    print(
        f"joint reward: first 10 steps {first:.3f} -> last 10 steps {last:.3f} ({time.time() - start:.1f}s)"
    )
    return 0 if last > first else 1


if __name__ == "__main__":
    raise SystemExit(main())
