"""Run by test_scale_team_multiprocess.py: the trainer of a heterogeneous team (a tiny Qwen3 and a
tiny Llama policy) on several JAX processes (gloo), the Qwen one with FSDP over all 8 devices.

The rollouts are deterministic functions of each problem (tokens, log-probs and advantages drawn
from the problem id), so one process seeing every process's problems makes the same updates.

    worker PID PORT OUT NPROC MODE   one of NPROC processes with 8 / NPROC CPU devices each
        MODE train:  2 steps, checkpoint at 2; process 0 writes the gathered parameters
        MODE resume: restore that checkpoint (written by another number of processes), 1 step
        MODE ragged: odd processes roll out twice as many samples, and only they sample the llama
                     policy; 3 steps must finish, with one update per policy
    single OUT     one process, 8 devices, the 4 shards' problems at once: the 2 steps of `train`
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np

THRESHOLD = 4  # samples per process and policy: one update per step (one problem x 2 agents x 4)
CONFIG = """
name: team
run_dir: {run_dir}
seed: 0
policies:
  qwen:
    model: {{preset: tiny-qwen3, dtype: float32, seed: 3}}
    optimizer: {{name: adamw, lr: 3.0e-3, eps: 1.0e-4}}
    buffer: {{threshold: {threshold}}}
    micro_batch_size: 8
    mesh: {{fsdp: 8}}
  llama:
    model: {{preset: tiny-llama, dtype: float32, seed: 4}}
    optimizer: {{name: adamw, lr: 3.0e-3, eps: 1.0e-4}}
    buffer: {{threshold: {threshold}}}
    micro_batch_size: 8
    mesh: {{data: 4, fsdp: 2}}
agents:
  alice: {{policy: qwen}}
  bob: {{policy: llama}}
data:
  source: {{kind: synthetic, n_train: 16, n_eval: 1}}
  batch_size: {batch_size}
sampler: {{max_new_tokens: 2, temperature: 1.0}}
workflow: {{kind: grpo, agent: alice}}
train: {{steps: {steps}, save_every: 2, log_to: [], progress: false}}
"""


def make_trainer(
    out: Path, run: str, *, steps: int, threshold: int = THRESHOLD, batch_size: int = 1, per=lambda problem: 4
):
    """A Trainer whose workflow writes `per(problem)` samples per agent of each problem."""
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer
    from marljax.workflows.types import Generation, Rollout

    path = out / f"{run}.yaml"
    text = CONFIG.format(run_dir=out / run, threshold=threshold, batch_size=batch_size, steps=steps)
    path.write_text(text)
    trainer = Trainer(load_config(path))
    base = type(trainer.workflow)

    class Fixed(base):
        def rollout(self, problems, agents, generator, verifier, seed):
            gens, ids, rewards, advantages = [], [], [], []
            for problem in problems:
                rng = np.random.default_rng(zlib.crc32(problem.id.encode()))
                for name in sorted(agents):
                    policy = agents[name].policy
                    for k in range(per(problem)):
                        prompt = rng.integers(3, 250, rng.integers(2, 7)).astype(np.int32)
                        completion = rng.integers(3, 250, rng.integers(1, 6)).astype(np.int32)
                        logp = (-rng.random(len(completion)) - 4.0).astype(np.float32)
                        version = trainer.policies[policy].version
                        gens.append(
                            Generation(
                                "", prompt, completion, logp, agent=name, policy=policy, version=version
                            )
                        )
                        ids.append({"problem": problem.id, "episode": k})
                        rewards.append(float(rng.random()))
                        advantages.append(float(rng.normal()))
            return Rollout(gens, ids, rewards, advantages, np.zeros(len(gens)))

    trainer.workflow = Fixed(trainer.workflow.cfg)
    return trainer


def gathered_params(trainer) -> dict[str, np.ndarray]:
    import jax
    from jax.experimental import multihost_utils

    out = {}
    for name, policy in trainer.policies.items():
        params = policy.params
        if jax.process_count() > 1:
            params = multihost_utils.process_allgather(params, tiled=True)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            out[f"{name}{jax.tree_util.keystr(path)}"] = np.asarray(jax.device_get(leaf))
    return out


def join(pid: int, port: int, nproc: int) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 8 // nproc)
    from marljax.train.distributed import DistributedConfig, initialize

    assert initialize(
        DistributedConfig(
            coordinator_address=f"localhost:{port}",
            num_processes=nproc,
            process_id=pid,
            initialization_timeout=120,
        )
    )
    assert jax.device_count() == 8 and jax.process_count() == nproc


def worker(pid: int, port: int, out: Path, nproc: int, mode: str) -> None:
    import jax

    join(pid, port, nproc)
    if mode == "train":
        trainer = make_trainer(out, "run", steps=2)
        assert len({d.process_index for d in trainer.policies["qwen"].learner.mesh.devices.flat}) == nproc
        trainer.run()
        params = gathered_params(trainer)
        if pid == 0:
            np.savez(out / "params.npz", **params)
    elif mode == "resume":
        trainer = make_trainer(out, "run", steps=3)
        assert trainer.restore() and trainer.step == 2
        assert {n: p.version for n, p in trainer.policies.items()} == {"qwen": 2, "llama": 2}
        saved = dict(np.load(out / "params.npz"))
        got = gathered_params(trainer)
        assert sorted(got) == sorted(saved) and all(np.array_equal(got[k], saved[k]) for k in saved)
        # 4 processes had served 2 batches each of their quarter: each half resumes after 4 of its own
        assert trainer.stream.step == 2 * 4 // nproc, trainer.stream.step
        metrics = trainer.train_step()
        assert {n: p.version for n, p in trainer.policies.items()} == {"qwen": 3, "llama": 3}
        assert np.isfinite(metrics["policy/qwen/loss"]) and np.isfinite(metrics["policy/llama/loss"])
        trainer.save()
        trainer.close()
    else:  # ragged: processes roll out different numbers of samples and sample different policies
        trainer = make_trainer(out, "ragged", steps=3, per=lambda problem: 2 + 2 * (pid % 2))
        rollout = trainer.workflow.rollout

        def sampling_rollout(problems, agents, generator, verifier, seed):
            if pid % 2:  # only these processes sample (the sampler's copy is made by every process)
                from marljax.train.config import SamplerConfig

                greedy = SamplerConfig(max_new_tokens=2, temperature=0.0)
                trainer.policies["llama"].sampler.generate([[5, 6, 7]], n=1, seed=seed, sampler=greedy)
            return rollout(problems, agents, generator, verifier, seed)

        trainer.workflow.rollout = sampling_rollout
        trainer.run()
        # updates need every process's buffer full: one update at step 2 (the even processes fill
        # theirs then), none at step 3
        assert {n: p.version for n, p in trainer.policies.items()} == {"qwen": 1, "llama": 1}
        left = {n: len(b) for n, b in trainer.buffers.items()}
        assert left == {n: [2, 8][pid % 2] for n in left}, left
    (out / f"done-{mode}-{pid}").write_text("ok")
    jax.distributed.shutdown()
    print(f"worker {pid} {mode}: OK")


class MergedStream:
    """One process's view of `shards` processes' streams: their batches of a step, concatenated."""

    def __init__(self, trainer, shards: int):
        from marljax.train.data import ProblemStream

        d = trainer.cfg.data
        self.streams = [
            ProblemStream(
                trainer.train_problems,
                batch_size=d.batch_size,
                seed=d.seed,
                shard_index=p,
                shard_count=shards,
            )
            for p in range(shards)
        ]

    def __next__(self):
        return [p for s in self.streams for p in next(s)]

    def get_state(self):
        return self.streams[0].get_state()


def single(out: Path) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from marljax.train.metrics import read_metrics

    trainer = make_trainer(out, "single", steps=2, threshold=4 * THRESHOLD)
    trainer.stream = MergedStream(trainer, 4)
    trainer.run()
    want = {r["step"]: r for r in read_metrics(out / "single")}
    got = {r["step"]: r for r in read_metrics(out / "run")}
    assert sorted(got) == sorted(want) == [1, 2], (sorted(got), sorted(want))
    compared = 0
    for step in want:
        for key, value in want[step].items():
            if key.startswith("policy/"):
                assert np.isclose(got[step][key], value, rtol=1e-4, atol=1e-5), (
                    step,
                    key,
                    got[step][key],
                    value,
                )
                compared += 1
    assert want[2]["policy/qwen/version"] == want[2]["policy/llama/version"] == 2
    params, saved = gathered_params(trainer), dict(np.load(out / "params.npz"))
    diff = max(float(np.max(np.abs(params[k] - saved[k]))) for k in params)
    assert diff <= 1e-5, diff
    print(f"single process: OK ({compared} metrics, parameters within {diff:.1e})")
    (out / "single.json").write_text(json.dumps({"compared": compared, "diff": diff}))


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        single(Path(sys.argv[2]))
