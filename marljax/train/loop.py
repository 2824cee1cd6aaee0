"""The training loop: workflow rollouts -> per-policy buffers -> updates -> metrics and checkpoints.

Every step draws a batch of problems, runs the workflow (which samples with
the current policies, scores in the sandbox and assigns credit), routes the
samples to their policy's buffer, and updates each policy whose buffer is
full -- independently of the others. Every `save_every` steps all policies
and the loop state (data iterator, buffers, workflow state, counters) are
checkpointed together; a restarted run resumes from the newest restorable
checkpoint and, with fixed seeds on CPU, reproduces the uninterrupted run;
`metrics.jsonl` then holds the steps up to that checkpoint, each once (a run
that starts afresh sets the old file aside in RUN_DIR/set_aside/).
Per-step randomness is derived from `(seed, step)`, so it needs no state.
`train.log_rollouts` also writes every N-th step's samples as text
(`marljax.train.rollout_log`, read with `marljax rollouts`).

The trainer owns what every workflow shares: the per-agent statistics of each
rollout (`Rollout.metrics`: `agent_metrics` and `amplification_metrics` of
`marljax.workflows.types`), the diversity of each agent's programs, and the
policy versions, which its `PolicyGenerator` stamps on every generation.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from marljax.rewards import Limits, SandboxPool, SandboxVerifier
from marljax.seeds import derive_seed
from marljax.train import distributed, dynamic_sampling, memory, rollout_log
from marljax.train.buffer import ExperienceBuffer
from marljax.train.checkpoint import RunCheckpointer
from marljax.train.config import ConfigError, RunConfig, SandboxPoolConfig, config_to_record, dump_config
from marljax.train.data import ProblemStream
from marljax.train.generation import PolicyGenerator
from marljax.train.metrics import MetricsWriter, Progress
from marljax.train.policy import BaseStore, build_policies
from marljax.train.sft import run_sft
from marljax.train.state import PolicyState
from marljax.workflows import build_workflow
from marljax.workflows.base import Agent
from marljax.workflows.diversity import per_agent_diversity
from marljax.workflows.types import Rollout, Rows

log = logging.getLogger(__name__)


def diversity_of(rollout: Rollout) -> dict[str, float]:
    """Per-agent diversity of this step's programs, within each problem's group, averaged."""
    groups: dict[str, dict[str, list[str]]] = {}
    for g, ids in zip(rollout.generations, rollout.ids):
        groups.setdefault(g.agent, {}).setdefault(str(ids.get("problem")), []).append(g.text)
    return per_agent_diversity({a: list(by_problem.values()) for a, by_problem in groups.items()})


# the workflow settings that decide credit (which rows are compared, with what reward), when a kind has them
CREDIT_KEYS = (
    "group_size",
    "normalization",
    "reward",
    "shapley",
    "counterfactual_samples",
    "singleton",
    "stop_on_solve",
    "overlong",
)


def recipe(cfg: RunConfig) -> list[str]:
    """One line per policy (its loss, KL and optimiser steps per update) and one for the workflow's
    credit: what a run trains with, said at its start (a recipe is easily not the method it is named
    after, e.g. one optimiser step per update leaves every PPO/GSPO ratio at 1)."""
    lines = []
    for name, p in sorted(cfg.policies.items()):
        loss = p.loss
        kl = f"KL {loss.kl_estimator} {loss.kl_coef:g} to the reference" if loss.kl_coef else "no KL"
        lines.append(
            f"policy {name}: loss {loss.type} ({loss.agg_mode}), clip [{loss.clip_low:g}, {loss.clip_high:g}], "
            f"{kl}, {p.mini_batches} optimiser step(s) per update, lr {p.optimizer.lr:g}"
        )
    w = cfg.workflow.model_dump()
    credit = ", ".join(f"{k}={w[k]}" for k in CREDIT_KEYS if k in w)
    lines.append(f"workflow {w['kind']}: {credit or 'its own credit'}")
    return lines


def sandbox_pool(s: SandboxPoolConfig) -> SandboxPool:
    """The sandbox pool of a run's `sandbox:` settings (a program's whole run within timeout_s, each
    of its tests within 4 s at most)."""
    limits = Limits(
        test_timeout_s=min(4.0, s.timeout_s), program_timeout_s=s.timeout_s, memory_mb=s.memory_mb
    )
    return SandboxPool(max_workers=s.workers, limits=limits)


class Trainer:
    """Builds everything a run needs from a `RunConfig`; `run()` trains to `train.steps`."""

    # policy -> its agents, for the per-agent gradient norms (`train.agent_grad_norms`); empty: off
    grad_norm_agents: dict[str, tuple[str, ...]] = {}

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        distributed.initialize(cfg.distributed)  # multi-process runs: before any JAX computation
        self.run_dir = Path(cfg.resolved_run_dir())
        self.bases = BaseStore()  # frozen bases of adapter policies, one copy per model
        self.policies = build_policies(cfg, self.bases)
        seq_len = cfg.sampler.max_prompt_len + cfg.sampler.max_new_tokens
        memory.log_estimates(self.policies, seq_len, log, cfg.sampler.slots)
        for line in recipe(cfg):
            log.info(line)
        self.agents = {
            name: Agent(name, a.policy, a.role, a.template) for name, a in sorted(cfg.agents.items())
        }
        self.buffers = {
            name: ExperienceBuffer(p.cfg.buffer.threshold, p.cfg.buffer.max_staleness)
            for name, p in self.policies.items()
        }
        if cfg.train.agent_grad_norms:
            self.grad_norm_agents = {
                p: tuple(sorted(a for a, c in cfg.agents.items() if c.policy == p)) for p in self.policies
            }
        self.train_problems = cfg.data.source.split("train")  # a marljax.tasks source
        self.eval_problems = cfg.data.source.split("eval")
        d = cfg.data
        self.stream = ProblemStream(
            self.train_problems, batch_size=d.batch_size, seed=d.seed, shuffle=d.shuffle, epochs=d.epochs
        )
        self.workflow = build_workflow(cfg.workflow)
        # each agent's sampling: the sampler block with its `sampling` over it (evaluation: greedy
        # unless `eval_sampling` says otherwise)
        sampling = {name: cfg.agent_sampling(name) for name in cfg.agents}
        eval_sampling = {name: cfg.agent_sampling(name, evaluation=True) for name in cfg.agents}
        self.generator = PolicyGenerator(self.policies, cfg.sampler, cfg.sampler.max_prompt_len, sampling)
        self.eval_generator = PolicyGenerator(
            self.policies, cfg.sampler, cfg.sampler.max_prompt_len, eval_sampling
        )
        t = cfg.train
        self.checkpointer = RunCheckpointer(
            self.run_dir,
            list(self.policies),
            keep=t.keep_checkpoints,
            keep_step_zero=t.sft_steps > 0,  # the warm start: other RL runs can start from it
            async_save=t.async_checkpoint,
        )
        self.step = 0
        self._pool: SandboxPool | None = None

    # ------------------------------------------------------------ plumbing
    @property
    def pool(self) -> SandboxPool:
        if self._pool is None:
            self._pool = sandbox_pool(self.cfg.sandbox)
        return self._pool

    @property
    def verifier(self) -> SandboxVerifier:
        return SandboxVerifier(self.pool)

    def loop_state(self) -> dict[str, Any]:
        """The step, and this process's data position, buffers and workflow state. On several
        processes each holds its own: all of them go in `processes` (in process order; a
        collective, so every process saves at the same steps), process 0's at the top level."""
        own = {
            "data": self.stream.get_state(),
            "buffers": {n: b.state_dict() for n, b in self.buffers.items()},
            "workflow": self.workflow.state_dict(),
        }
        state = {"step": self.step, **own}
        if jax.process_count() > 1:
            state["processes"] = distributed.allgather_objects(own)
        return state

    def _load_loop_state(self, loop: dict[str, Any]) -> None:
        """This process's part of a saved loop state. Saved by another number of processes, the
        buffered samples are dealt out to the processes now running (oldest first, round robin),
        each data stream resumes at the same fraction of its epoch, and every process takes
        process 0's workflow state."""
        saved = loop.get("processes") or [{k: loop[k] for k in ("data", "buffers", "workflow")}]
        pid, count = jax.process_index(), jax.process_count()
        if len(saved) == count:
            own = saved[pid]
            self.stream.set_state(own["data"])
            buffers, workflow = own["buffers"], own["workflow"]
        else:
            log.warning("checkpoint of %d processes resumed on %d: buffers re-dealt", len(saved), count)
            data = self.stream.get_state()
            data["next_index"] = round(sum(s["data"]["next_index"] for s in saved) / count)
            self.stream.set_state(data)
            buffers = {}
            for name in saved[0]["buffers"]:
                parts = [s["buffers"][name] for s in saved]
                pooled = Rows.concatenate([Rows.from_json(part["rows"]) for part in parts])
                oldest_first = np.argsort(pooled.version, kind="stable")
                totals = {
                    k: sum(part[k] for part in parts) if pid == 0 else 0
                    for k in ("added", "taken", "dropped")
                }
                buffers[name] = {"rows": pooled[oldest_first[pid::count]].to_json(), **totals}
            workflow = saved[0]["workflow"]
        for name, state in buffers.items():
            self.buffers[name].load_state_dict(state)
        self.workflow.load_state_dict(workflow)

    def save(self) -> None:
        self.checkpointer.save(
            self.step, {n: p.state.checkpoint() for n, p in self.policies.items()}, self.loop_state()
        )

    def restore(self, step: int | None = None) -> bool:
        """Load the newest complete checkpoint (or `step`'s); False for a fresh run."""
        targets = {n: p.state.restore_target() for n, p in self.policies.items()}
        if step is not None:  # a step the run does not keep fails before the states are freed
            self.checkpointer.check_step(step, hashes=False)
        # the restored states replace the loaded ones: free those first, else a resume needs the
        # memory of two full states at once
        released = self.checkpointer.latest_step() is not None
        if released:
            for policy in self.policies.values():
                policy.release_state()
        got = self.checkpointer.restore(targets, step)
        if got is None:
            if released:  # no step verified after all: start afresh from the initial weights
                # in place: the generators hold this dict and would sample with the released policies
                self.policies.update(build_policies(self.cfg, self.bases))
            return False
        step, states, loop = got
        for name, state in states.items():
            self.policies[name].state = PolicyState.from_checkpoint(state)
        self._load_loop_state(loop)
        self.step = int(loop["step"])
        log.info("resumed %s at step %d", self.run_dir, step)
        return True

    # ---------------------------------------------------------------- steps
    def sync_samplers(self) -> None:
        """Multi-process runs: every policy's per-process sampler copy, made now on every process
        in the same order (`SamplerView.sync`), so sampling needs no collective."""
        for policy in self.policies.values():
            policy.sampler.sync()

    def update_ready_policies(self) -> dict[str, float]:
        """Update every policy whose buffer is full, as often as it is full. All updates are
        dispatched before any metric is read, so policies on disjoint devices overlap.

        On several processes an update is one computation over all of them: a policy updates
        when the buffers of all processes are full (each contributes `threshold` samples), so
        every process makes the same number of updates even when their rollouts differ in size;
        the fuller buffers keep their extra samples for the next update."""
        out: dict[str, float] = {}
        pending: dict[str, list] = {}
        dropped_before = {name: buf.dropped for name, buf in self.buffers.items()}
        for name, policy in self.policies.items():
            buf, pending[name] = self.buffers[name], []
            while distributed.all_processes(buf.ready(policy.version)):
                batch, stats = buf.take(policy.version)
                diagnose = {"agents": self.grad_norm_agents[name]} if name in self.grad_norm_agents else {}
                pending[name].append((policy.start_update(batch, **diagnose), stats))
        for name, policy in self.policies.items():
            buf, dropped = self.buffers[name], self.buffers[name].dropped - dropped_before[name]
            history = [{**policy.finish_update(p), **stats} for p, stats in pending[name]]
            if dropped:
                log.warning(
                    "policy %s: dropped %d samples older than max_staleness=%s",
                    name,
                    dropped,
                    buf.max_staleness,
                )
            prefix = f"policy/{name}"
            out[f"{prefix}/updates"] = float(len(history))
            out[f"{prefix}/version"] = float(policy.version)
            out[f"{prefix}/buffer"] = float(len(buf))
            out[f"{prefix}/dropped_stale"] = float(dropped)
            for key in dict.fromkeys(k for h in history for k in h):
                values = [h[key] for h in history if key in h]
                if key.startswith("agent_grad_norm/"):  # -> agent/<name>/grad_norm
                    out[f"agent/{key.split('/', 1)[1]}/grad_norm"] = float(np.mean(values))
                else:
                    out[f"{prefix}/{key}"] = float(np.mean(values))
            if history and any(h["skipped"] for h in history):
                log.warning("policy %s: non-finite loss or gradient, update skipped", name)
        self.sync_samplers()
        return out

    def train_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        self.sync_samplers()
        seed = derive_seed(self.cfg.seed, self.step)
        rollout = self.workflow.rollout(next(self.stream), self.agents, self.generator, self.verifier, seed)
        sampled, sampling = rollout, {}
        if self.cfg.train.dynamic_sampling is not None:

            def more(round_: int) -> Rollout:
                again = derive_seed(seed, round_)
                return self.workflow.rollout(
                    next(self.stream), self.agents, self.generator, self.verifier, again
                )

            rollout, sampled, sampling = dynamic_sampling.collect(
                rollout, more, self.cfg.data.batch_size, self.cfg.train.dynamic_sampling
            )
        t1 = time.perf_counter()
        if rollout is not None:  # None: dynamic sampling skips the step
            for k, name in enumerate(rollout.policy_names):
                self.buffers[name].add(rollout.rows[rollout.policy_ids == k])
        # the rollout's metrics describe everything sampled, the dropped problems too
        metrics = {
            **sampled.metrics,
            **sampling,
            **self.workflow.overlong_metrics(sampled),
            **diversity_of(sampled),
            **self.update_ready_policies(),
        }
        self.step += 1
        metrics.update({"time/rollout_s": t1 - t0, "time/update_s": time.perf_counter() - t1})
        if rollout is not None:
            self.log_rollout(rollout)
        return metrics

    def log_rollout(self, rollout: Rollout) -> None:
        """Write the step's samples to `RUN_DIR/rollouts/` every `train.log_rollouts` steps (process
        0 only, like the metrics: on several hosts it logs its own share of the batch)."""
        every = self.cfg.train.log_rollouts
        if every and self.step % every == 0 and distributed.is_primary():
            tokenizers = {name: p.turns.tokenizer for name, p in self.policies.items()}
            rollout_log.write_step(
                self.run_dir, self.step, rollout_log.rollout_records(self.step, rollout, tokenizers)
            )

    def evaluate(self) -> dict[str, float]:
        if not self.eval_problems:
            return {}
        self.sync_samplers()
        return self.workflow.evaluate(
            self.eval_problems, self.agents, self.eval_generator, self.verifier, self.generator
        )

    def run(self) -> None:
        cfg, t = self.cfg, self.cfg.train
        if "wandb" in t.log_to and distributed.is_primary() and importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                [
                    'train.log_to: wandb is not installed: pip install "marljax[wandb]" (or drop it from the list)'
                ]
            )
        # a config of another run is refused before anything in the directory changes; a new one
        # is written only when this run has steps to do
        now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.run_dir.mkdir(parents=True, exist_ok=True)
        record = config_to_record(cfg, self.run_dir, now)
        resumed = self.restore()
        if self.step >= t.steps:
            log.warning(
                "%s is already at step %d >= train.steps=%d: nothing to do (raise train.steps to go on)",
                self.run_dir,
                self.step,
                t.steps,
            )
            self.close()  # nothing written: no metrics reopened, no empty progress bar
            return
        if record is not None and distributed.is_primary():
            dump_config(cfg, record)
            if record.name != "config.yaml":
                log.info("settings changed since the last run: recorded in %s", record)
        if distributed.is_primary():  # the steps after the restored one will be redone
            rollout_log.prune_after(self.run_dir, self.step)
        wandb = {**t.wandb.model_dump(), "name": cfg.name, "config": cfg.model_dump(mode="json")}
        with MetricsWriter(self.run_dir, log_to=t.log_to, wandb=wandb) as writer:
            if resumed:
                writer.resume(self.step)
            else:
                writer.start_afresh()
                if t.sft_steps:
                    run_sft(self, t.sft_steps, writer)
            with Progress(
                t.steps, initial=self.step, desc=cfg.name, enabled=None if t.progress else False
            ) as bar:
                # step 0: the starting point (after any warm start) that RL's evaluations compare with
                if not resumed and t.eval_every and self.eval_problems:
                    bar.note(f"evaluating {len(self.eval_problems)} problems before RL")
                    writer.write(0, self.evaluate())
                if not resumed and t.sft_steps:  # the warm start, kept as step 0
                    writer.sync()
                    self.save()
                while self.step < t.steps:
                    metrics = self.train_step()
                    if t.eval_every and self.step % t.eval_every == 0:
                        bar.note(f"evaluating {len(self.eval_problems)} problems")
                        metrics.update(self.evaluate())
                    if self.step % t.log_every == 0:
                        writer.write(self.step, metrics)
                    bar.update(
                        1,
                        **{  # "agent/a/reward" as a.reward; an evaluation's keep their "eval."
                            (k if k.startswith("eval/") else k.split("/", 1)[1]).replace("/", "."): v
                            for k, v in metrics.items()
                            if k.endswith(("/reward", "/kl_ref"))
                        },
                    )
                    if self.step % t.save_every == 0 or self.step == t.steps:
                        writer.sync()  # else a power cut can leave the checkpoint ahead of its metrics
                        self.save()
        self.close()

    def close(self) -> None:
        self.checkpointer.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
