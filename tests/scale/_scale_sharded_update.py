"""Run by test_scale_sharded_update.py with 8 simulated CPU devices: a Policy update on a
(data, fsdp, tensor) mesh must give the single-device parameters within 1e-5, with the
parameters and optimiser moments really split over the mesh."""

from __future__ import annotations

import math
import os
import sys

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _scale_common import MIN_CHANGE, TOL, host, max_diff, policy_config, samples  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marljax.train.memory import policy_estimate  # noqa: E402
from marljax.train.policy import Policy  # noqa: E402

assert jax.device_count() == 8, jax.devices()


# every mesh axis alone and mixed; the model's activations are pinned to rows over data x fsdp
MESHES = ({"fsdp": 8}, {"data": 8}, {"fsdp": 4, "tensor": 2}, {"data": 2, "fsdp": 2, "tensor": 2})


def _trimmed(spec) -> tuple:
    """A spec's entries without trailing Nones (how `logical_to_spec` writes them)."""
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def device0_bytes(tree) -> int:
    """Bytes that the arrays of `tree` hold on device 0 (any array with a shape)."""
    dev = jax.devices()[0]
    return sum(
        s.data.nbytes
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array) and x.ndim
        for s in x.addressable_shards
        if s.device == dev
    )


def main():
    batch = samples(12, seed=1)
    single = Policy("p", policy_config())
    init = host(single.params)
    metrics1 = single.update(batch)
    want = host(single.params)
    moved = max_diff(init, want)
    assert moved > MIN_CHANGE, f"the update barely moved the parameters ({moved})"
    assert metrics1["skipped"] == 0 and np.isfinite(metrics1["loss"]), metrics1

    for mesh in MESHES:
        name = " ".join(f"{k}={v}" for k, v in mesh.items())
        pol = Policy("p", policy_config(mesh, micro_batch_size=8))  # rows split 8 ways at most
        assert max_diff(host(pol.params), init) == 0.0, "sharded init differs from single-device init"
        # really split: rule-table specs (a mesh axis of size 1 splits nothing), 8 devices, each
        # holding a fraction of every matrix
        fsdp = "fsdp" if mesh.get("fsdp", 1) > 1 else None
        tensor = "tensor" if mesh.get("tensor", 1) > 1 else None
        specs = {k: pol.params["layers"][k].sharding.spec for k in ("wq", "w_down", "w_up")}
        want_specs = {
            "wq": P(None, fsdp, tensor),
            "w_down": P(None, tensor, fsdp),
            "w_up": P(None, fsdp, tensor),
        }
        assert specs == {k: P(*_trimmed(v)) for k, v in want_specs.items()}, specs
        assert pol.params["embed"].sharding.spec == P(*_trimmed(P(tensor, fsdp))), pol.params[
            "embed"
        ].sharding
        for path, x in jax.tree_util.tree_leaves_with_path(pol.params):
            assert len(x.sharding.device_set) == 8, path
            # each device holds 1 / (product of the spec's mesh axes) of the array
            split = math.prod(
                pol.learner.mesh.shape[a]
                for e in x.sharding.spec
                if e
                for a in (e if isinstance(e, tuple) else (e,))
            )
            assert x.addressable_shards[0].data.size * split == x.size, (path, x.sharding)
        mu = pol.state.opt_state[1][0].mu  # clip -> adamw chain: (ScaleByAdamState, ...)
        assert mu["layers"]["wq"].sharding.spec == specs["wq"], mu["layers"]["wq"].sharding
        # the memory estimate's per-device parameter and optimiser bytes are what device 0 holds
        est = policy_estimate(pol, 64)
        got_p, got_o = device0_bytes(pol.params), device0_bytes(pol.state.opt_state)
        assert (est.params, est.optimizer) == (got_p, got_o), ((est.params, est.optimizer), (got_p, got_o))

        metrics = pol.update(batch)
        diff = max_diff(host(pol.params), want)
        assert diff <= TOL, f"{name}: sharded update differs from single-device by {diff}"
        for k in ("loss", "pg_loss", "grad_norm", "entropy"):
            assert abs(metrics[k] - metrics1[k]) <= 1e-5 * max(1.0, abs(metrics1[k])), (
                k,
                metrics[k],
                metrics1[k],
            )
        assert pol.params["layers"]["wq"].sharding.spec == specs["wq"]  # layout kept
        print(f"sharded update {name}: OK (max diff {diff:.2e}, parameters moved {moved:.2e})")


if __name__ == "__main__":
    main()
    sys.exit(0)
