"""Run by test_scale_device_groups.py with 8 simulated CPU devices: two policies on disjoint
4-device groups both train and sample on their own devices; a sampler layout that differs
from the trainer's gets the parameters device to device, never through the host."""

from __future__ import annotations

import contextlib
import os
import sys

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _scale_common import MIN_CHANGE, host, max_diff, policy_config, samples  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marljax.models import param_dict_shardings  # noqa: E402
from marljax.models.sharding import reshard  # noqa: E402
from marljax.sampler import SamplingParams, generate  # noqa: E402
from marljax.train.config import SamplerConfig  # noqa: E402
from marljax.train.generation import PolicyGenerator, disjoint_devices  # noqa: E402
from marljax.train.policy import Policy  # noqa: E402
from marljax.workflows.base import Agent  # noqa: E402

assert jax.device_count() == 8, jax.devices()
DEVICES = jax.devices()
GROUPS = {"a": set(DEVICES[:4]), "b": set(DEVICES[4:])}


def no_host_transfers():
    """Fail on any explicit or implicit host <-> device copy (a host round trip must re-upload)."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.transfer_guard_device_to_host("disallow_explicit"))
    stack.enter_context(jax.transfer_guard_host_to_device("disallow_explicit"))
    return stack


def devices_of(tree) -> set:
    return set().union(*(x.sharding.device_set for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)))


def main():
    # a: FSDP trainer, data x tensor sampler on the same 4 devices; b: one layout for both
    pols = {
        "a": Policy(
            "a",
            policy_config(
                {"fsdp": 4, "devices": [0, 1, 2, 3]}, {"data": 2, "tensor": 2, "devices": [0, 1, 2, 3]}
            ),
        ),
        "b": Policy(
            "b", policy_config({"fsdp": 2, "tensor": 2, "devices": [4, 5, 6, 7]}, preset="tiny-llama")
        ),
    }
    for name, pol in pols.items():
        assert devices_of(pol.state.checkpoint()) == GROUPS[name], (name, devices_of(pol.state.checkpoint()))

    # the sampler copy of a: resharded on device (explicit host transfers are forbidden here)
    a = pols["a"]
    target = param_dict_shardings(a.config, a.sampler.mesh)
    with no_host_transfers():
        sp = a.sampler.params()
        other = reshard(
            a.params, param_dict_shardings(a.config, pols["b"].learner.mesh)
        )  # onto the other group
        try:  # control: plain device_put to the new layout goes through the host, and the guard sees it
            jax.device_put(a.params["layers"]["wq"], target["layers"]["wq"])
            raise AssertionError("device_put resharding was not caught by the transfer guard")
        except jax.errors.JaxRuntimeError as e:
            assert "Disallowed host-to-device transfer" in str(e), e
    assert devices_of(other) == GROUPS["b"] and max_diff(host(other), host(a.params)) == 0.0
    assert sp["layers"]["wq"].sharding.spec == P(None, None, "tensor"), sp["layers"]["wq"].sharding
    assert a.params["layers"]["wq"].sharding.spec == P(None, "fsdp"), a.params["layers"]["wq"].sharding
    assert devices_of(sp) == GROUPS["a"] and set(a.sampler.mesh.devices.flat) == GROUPS["a"]
    assert max_diff(host(sp), host(a.params)) == 0.0
    assert a.sampler.params() is sp  # cached until the parameters change
    assert pols["b"].sampler.params() is pols["b"].params  # same layout: no copy

    # both sample on their own devices; a's sampler layout gives the trainer layout's tokens
    greedy = SamplerConfig(max_new_tokens=6, temperature=0.0)
    prompts = [[5, 9, 11, 40], [7, 8], [100, 3, 4, 5, 6, 7]]
    outs = {name: pol.sampler.generate(prompts, n=2, seed=0, sampler=greedy) for name, pol in pols.items()}
    ref = generate(
        a.config,
        prompts,
        SamplingParams(6, temperature=0.0),
        params=a.params,
        n=2,
        seed=0,
        eos_ids=a.turns.eos_ids,
        pad_id=a.turns.pad_id,
        mesh=a.learner.mesh,
    )
    np.testing.assert_array_equal(outs["a"].tokens, ref.tokens)
    np.testing.assert_allclose(outs["a"].logprobs, ref.logprobs, atol=1e-5)
    assert outs["b"].tokens.shape[0] == 6
    # a workflow's request for both policies: sampled concurrently, same tokens as one by one
    team = [Agent("x", "a"), Agent("y", "b")]
    gen = PolicyGenerator(pols, greedy)
    assert disjoint_devices(list(pols.values()))
    requests = [(team[i % 2], text) for i, text in enumerate(["def f(x):", "return", "x = 3", "print("])]
    together = gen.generate(requests, 2, seed=0)
    for (agent, text), got in zip(requests, together):
        alone = gen.generate([(agent, text)], 2, seed=0)[0]
        assert [g.text for g in got] == [g.text for g in alone], (agent, text)

    # both train, and their state stays on their own devices
    for k, (name, pol) in enumerate(pols.items()):
        before = host(pol.params)
        metrics = pol.update(samples(8, seed=10 + k))
        assert metrics["skipped"] == 0 and np.isfinite(metrics["loss"]), (name, metrics)
        assert max_diff(before, host(pol.params)) > MIN_CHANGE, name
        assert devices_of(pol.state.checkpoint()) == GROUPS[name], name
        assert pol.version == 1
    sp2 = a.sampler.params()
    assert sp2 is not sp and max_diff(host(sp2), host(a.params)) == 0.0  # re-synced after the update
    print("two policies on disjoint device groups: OK")


if __name__ == "__main__":
    main()
    sys.exit(0)
