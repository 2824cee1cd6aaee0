"""Run by test_scale_multiprocess.py. Two modes:

`worker PID PORT OUT`: one of two JAX processes on localhost (2 CPU devices each, gloo
collectives), joined through `marljax.train.distributed.initialize`; the one that reaches
`distributed.barrier` first waits there for the other. A policy on a
data=2 (processes) x fsdp=2 (local devices) mesh samples its own prompts on its own
devices (a per-process copy split tensor=2, gathered on device), takes two data-parallel
updates (each process holds half of each batch) and writes two checkpoints with
RunCheckpointer; process 0 saves the gathered parameters.

An adapter policy on the same model and mesh samples from per-process copies too (the base
copied once).

`single OUT`: one process, one device: the same two updates on the whole batches must give
the workers' parameters within 1e-5, the workers' checkpoint must restore here to exactly
the workers' state, and the workers' greedy generations (of both policies) must be this
process's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from _scale_common import MIN_CHANGE, TOL, host, max_diff, policy_config, samples

BATCHES = [samples(12, seed=21), samples(12, seed=22)]
PROMPTS = [[[5, 9, 11, 40], [7, 8, 9]], [[100, 3, 4, 5, 6, 7], [12, 13]]]  # one list per process
LORA = {"rank": 4, "alpha": 8, "seed": 1}


def moved_adapter(pol):
    """The adapter policy with a non-zero update (a new adapter computes exactly the base)."""
    import jax

    pol.state = pol.state.replace(params=jax.tree.map(lambda x: x + 0.05, pol.params))
    return pol


def greedy():
    from marljax.train.config import SamplerConfig

    return SamplerConfig(max_new_tokens=5, temperature=0.0)


def flat(tree) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def worker(pid: int, port: int, out: Path) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    from marljax.train.distributed import DistributedConfig, barrier, initialize

    assert initialize(
        DistributedConfig(
            coordinator_address=f"localhost:{port}",
            num_processes=2,
            process_id=pid,
            initialization_timeout=120,
        )
    )
    from jax.experimental import multihost_utils
    from jax.sharding import PartitionSpec as P

    from marljax.tasks import parse_row
    from marljax.train.checkpoint import RunCheckpointer
    from marljax.train.data import ProblemStream
    from marljax.train.metrics import MetricsWriter
    from marljax.train.policy import Policy

    assert (jax.process_index(), jax.process_count(), jax.device_count()) == (pid, 2, 4)
    # a process that arrives late at `barrier` holds the other there (gloo would not wait 30 s):
    # process 0 leaves it no earlier than process 1 arrived (Linux's monotonic clock is one for the
    # whole machine; the two processes start at different times on a busy machine, so the length of
    # process 0's wait is no measure)
    arrival, clock = out / "late_arrival", lambda: time.clock_gettime(time.CLOCK_MONOTONIC)
    if pid == 1:
        time.sleep(2.0)
        arrival.write_text(repr(clock()))
    barrier("late second process")
    assert pid == 1 or clock() >= float(arrival.read_text())
    assert MetricsWriter(out / "metrics", enabled=None).enabled == (pid == 0)  # only process 0 writes
    toy = [parse_row({"problem": f"q{i}", "answer": "1", "id": f"p{i}"}, "math", "toy") for i in range(8)]
    stream = ProblemStream(toy, batch_size=2, seed=0)  # grain shards problems by process
    assert stream._config["shard_index"] == pid and stream.epoch_size == 4
    (out / f"shard{pid}.json").write_text(json.dumps(sorted(p.id for _ in range(2) for p in next(stream))))

    # trainer: data over the processes, fsdp over each one's devices; sampler: tensor=2 inside each process
    pol = Policy("p", policy_config({"data": 2, "fsdp": 2}, {"data": 2, "tensor": 2}, mini_batches=1))
    assert {d.process_index for d in pol.params["embed"].sharding.device_set} == {0, 1}
    # sampling: a per-process copy on this process's devices, each process with its own prompts
    sp = pol.sampler.params()
    assert all(x.is_fully_addressable for x in jax.tree.leaves(sp))
    assert set(pol.sampler.mesh.devices.flat) == set(jax.local_devices())
    assert sp["layers"]["wq"].sharding.spec == P(None, None, "tensor"), sp["layers"]["wq"].sharding
    assert max_diff(host(sp), host(multihost_utils.process_allgather(pol.params, tiled=True))) == 0.0
    gen = pol.sampler.generate(PROMPTS[pid], n=1, seed=0, sampler=greedy())
    q = moved_adapter(Policy("q", policy_config({"data": 2, "fsdp": 2}, {"data": 2, "tensor": 2}, lora=LORA)))
    assert all(x.is_fully_addressable for x in jax.tree.leaves(q.sampler.params()))
    assert q.sampler.base()["layers"]["wq"].sharding.spec == P(None, None, "tensor")
    np.save(
        out / f"adapter_gen{pid}.npy", q.sampler.generate(PROMPTS[pid], n=1, seed=0, sampler=greedy()).tokens
    )
    for batch in BATCHES:  # this process's half of every batch
        metrics = pol.update(batch[pid::2])
        assert metrics["skipped"] == 0 and np.isfinite(metrics["loss"]), metrics
    params = multihost_utils.process_allgather(pol.params, tiled=True)
    with RunCheckpointer(out / "run", ["p"]) as ckpt:
        ckpt.save(2, {"p": pol.state.checkpoint()}, {"step": 2})
        ckpt.save(3, {"p": pol.state.checkpoint()}, {"step": 3})  # a second async save reuses every barrier
    if pid == 0:
        np.savez(out / "params.npz", **flat(params))
    np.save(out / f"gen{pid}.npy", gen.tokens)
    (out / f"done{pid}").write_text(json.dumps(metrics))
    jax.distributed.shutdown()  # a barrier: neither process leaves while the other still needs it
    print(f"worker {pid}: OK")


def single(out: Path) -> None:
    import jax

    from marljax.train.checkpoint import RunCheckpointer
    from marljax.train.policy import Policy
    from marljax.train.state import PolicyState

    assert jax.process_count() == 1
    shards = [set(json.loads((out / f"shard{pid}.json").read_text())) for pid in (0, 1)]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 8, shards  # disjoint, cover an epoch
    pol = Policy("p", policy_config(mini_batches=1))
    init = host(pol.params)
    q = moved_adapter(Policy("q", policy_config(lora=LORA)))
    for pid in (0, 1):  # the workers sampled from the same initial parameters
        gen = pol.sampler.generate(PROMPTS[pid], n=1, seed=0, sampler=greedy())
        np.testing.assert_array_equal(np.load(out / f"gen{pid}.npy"), gen.tokens)
        gen = q.sampler.generate(PROMPTS[pid], n=1, seed=0, sampler=greedy())
        np.testing.assert_array_equal(np.load(out / f"adapter_gen{pid}.npy"), gen.tokens)
    for batch in BATCHES:
        pol.update(batch)
    want = flat(host(pol.params))
    got = dict(np.load(out / "params.npz"))
    assert sorted(got) == sorted(want)
    moved = max_diff(init, host(pol.params))
    diff = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    assert moved > MIN_CHANGE and diff <= TOL, (moved, diff)

    fresh = Policy("p", policy_config(mini_batches=1))
    with RunCheckpointer(out / "run", ["p"]) as ckpt:
        step, states, loop = ckpt.restore({"p": fresh.state.restore_target()})
    assert step == 3 and loop == {"step": 3}, (step, loop)
    restored = states["p"]
    assert int(restored["version"]) == 2 and int(restored["step"]) == 2
    assert all(np.array_equal(got[k], v) for k, v in flat(host(restored["params"])).items())
    assert max_diff(host(restored["opt_state"]), host(pol.state.opt_state)) <= TOL
    fresh.state = PolicyState.from_checkpoint(restored)
    assert np.isfinite(fresh.update(BATCHES[0])["loss"])  # the restored state trains on
    print(f"single process: OK (max diff {diff:.2e}, parameters moved {moved:.2e})")


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
    else:
        single(Path(sys.argv[2]))
