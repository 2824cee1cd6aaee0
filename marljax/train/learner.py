"""The learner: a policy's jitted update steps, applied to its `PolicyState`.

Full-weight and adapter training are one path: the state's `params` are the trainable part, and the
model maths sees `combine(trainable, frozen)`. A full-weight policy freezes nothing (`frozen` is
None: the trainable part is the model); an adapter policy (`lora:`, `marljax.models.lora`) trains
a LoRA adapter on a frozen base, shared with the other adapters on it and neither donated nor
changed by a step. Gradients, optimiser state and the KL reference cover the trainable part only.

Layouts. The update runs on the policy's `mesh` (e.g. FSDP over `fsdp`, Megatron splits over
`tensor`). On a multi-process run the update takes each process's rows as its share of the rows
of every micro-batch (`jax.make_array_from_process_local_data`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from marljax.models.config import ModelConfig
from marljax.models.decoder import param_dict_shardings
from marljax.models.lora import LoraSpec, stack_adapters
from marljax.train import distributed
from marljax.train.batch import collate
from marljax.train.config import LossConfig, OptimizerConfig
from marljax.train.optim import make_optimizer, make_schedule
from marljax.train.state import PolicyState
from marljax.train.update import make_agent_grad_norm_fn, make_logprob_fn, make_update_fn, rl_loss, sft_loss
from marljax.workflows.types import Rows


def combine(trainable: dict, frozen: dict | None, *, lora: LoraSpec | None) -> dict:
    """The parameters the model maths takes: the trainable part itself when nothing is frozen, else
    the frozen base with the trainable adapter."""
    return trainable if frozen is None else {**frozen, "lora": stack_adapters([(lora, trainable)])}


def _training(config: ModelConfig, lora: LoraSpec | None, mesh: Mesh | None):
    """(combine, dropout, shardings): how the trainable part enters the model, the adapter dropout,
    and the trainable part's layout that the gradient accumulator keeps (the rule table's for a
    whole model, replicated for an adapter)."""
    dropout = 0.0 if lora is None else lora.dropout
    shardings = None
    if mesh is not None:
        shardings = (
            param_dict_shardings(config, mesh) if lora is None else NamedSharding(mesh, PartitionSpec())
        )
    return functools.partial(combine, lora=lora), dropout, shardings


@functools.lru_cache(maxsize=32)
def step_functions(
    config: ModelConfig,
    optimizer_cfg: OptimizerConfig,
    loss: LossConfig,
    use_old_logp: bool,
    lora: LoraSpec | None = None,
    mesh: Mesh | None = None,
):
    """(optimizer, rl update, sft update, log-probs), the updates jitted and traced under `mesh`;
    shared by policies with equal settings (the frozen configs and the mesh are the cache key), so a
    team of agents of one architecture compiles each shape once, not once per agent. optax optimisers
    keep no state of their own, so sharing one is safe. The updates are
    `update(trainable, opt_state, batch, frozen=None)` (see the module doc)."""
    optimizer, schedule = make_optimizer(optimizer_cfg), make_schedule(optimizer_cfg)
    join, dropout, shardings = _training(config, lora, mesh)
    rl = make_update_fn(
        functools.partial(rl_loss, config=config, loss=loss, use_old_logp=use_old_logp, lora_dropout=dropout),
        optimizer,
        loss.agg_mode,
        schedule,
        join,
        mesh,
        shardings,
    )
    sft = make_update_fn(
        functools.partial(sft_loss, config=config, lora_dropout=dropout),
        optimizer,
        "token-mean",
        schedule,
        join,
        mesh,
        shardings,
    )
    return optimizer, rl, sft, make_logprob_fn(config, mesh)


@functools.lru_cache(maxsize=32)
def _agent_norm_function(
    config: ModelConfig, loss: LossConfig, use_old_logp: bool, lora: LoraSpec | None, mesh: Mesh | None
):
    """The jitted per-agent gradient-norm diagnostic of the RL loss (`make_agent_grad_norm_fn`);
    built on first use only, so runs without the diagnostic compile nothing more."""
    join, dropout, _ = _training(config, lora, mesh)
    return make_agent_grad_norm_fn(
        functools.partial(rl_loss, config=config, loss=loss, use_old_logp=use_old_logp, lora_dropout=dropout),
        loss.agg_mode,
        join,
        mesh,
    )


def _pad_batch(batch: dict, M: int, T: int, pad_id: int) -> dict:
    """`collate` arrays padded to M micro-batches and length T with rows that carry no loss."""
    out = {}
    for k, v in batch.items():
        widths = [(0, M - v.shape[0]), (0, 0)] + ([(0, T - v.shape[2])] if v.ndim == 3 else [])
        fill = {"tokens": pad_id, "labels": pad_id, "temperature": 1.0}.get(k, 0)
        out[k] = np.pad(v, widths, constant_values=fill)
    out["positions"] = np.broadcast_to(np.arange(T, dtype=np.int32), out["tokens"].shape).copy()
    return out


def _counters_on(opt_state, mesh):
    """optax makes its scalars (step counters, learning rate, skip flags) uncommitted on the default
    device; commit them where the parameters are (replicated on the policy's mesh), as the update
    returns them: else its second call sees other input shardings and compiles again (the moments
    already follow the parameters)."""
    if mesh is None:
        return jax.device_put(opt_state, jax.devices()[0])
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(
        lambda x: (
            jax.device_put(np.asarray(x), replicated) if isinstance(x, jax.Array) and x.ndim == 0 else x
        ),
        opt_state,
    )


def _to_float(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def finish_update(pending: list) -> dict[str, float]:
    """The metrics of a dispatched update (`Learner.start_update`), averaged over its mini-batches."""
    history = [_to_float(m) for m in pending]
    keys = dict.fromkeys(k for h in history for k in h)  # an agent may miss some mini-batches
    out = {k: float(np.mean([h[k] for h in history if k in h])) for k in keys}
    out["skipped"] = float(sum(h["skipped"] for h in history))
    return out


class Learner:
    """The update steps of one policy: batches from rows, RL and SFT steps, the per-agent
    gradient-norm diagnostic. Holds no trainable state: each step takes a `PolicyState` and
    returns the next one.

    `frozen`: the frozen base of an adapter policy (`lora`), None for a full-weight one;
    `micro_batch_size`, `mini_batches`: the policy's; `seed`: the run's (mini-batch order and
    dropout masks)."""

    def __init__(
        self,
        config: ModelConfig,
        optimizer: OptimizerConfig,
        loss: LossConfig,
        *,
        micro_batch_size: int,
        mini_batches: int,
        mesh: Mesh | None,
        lora: LoraSpec | None,
        frozen: dict | None,
        pad_id: int,
        seed: int,
    ):
        self.config, self.loss, self.mesh, self.lora, self.frozen = config, loss, mesh, lora, frozen
        self.micro_batch_size, self.mini_batches, self.pad_id, self.seed = (
            micro_batch_size,
            mini_batches,
            pad_id,
            seed,
        )
        self.optimizer_cfg = optimizer
        self.optimizer, self._rl_update, self._sft_update, self._logprobs = step_functions(
            config, optimizer, loss, mini_batches > 1, lora, mesh
        )
        _, self.dropout, _ = _training(config, lora, mesh)

    def model_params(self, trainable: dict) -> dict:
        """The parameters the model maths takes for `trainable` (see the module doc)."""
        return combine(trainable, self.frozen, lora=self.lora)

    def new_optimizer(self, params: dict):
        """A fresh optimiser state: moments at zero and the learning-rate schedule at its first step.
        On a multi-process mesh this is the run's first program that spans processes: all wait
        for each other first (`distributed.barrier`), however unevenly they started."""
        distributed.barrier("optimizer state")
        return _counters_on(self.optimizer.init(params), self.mesh)

    def initial_state(self, params: dict, *, reference: bool) -> PolicyState:
        """The state before any step: `params` with a fresh optimiser, and with `reference` a copy of
        them as the KL reference (a copy, because the update donates the buffers of `params`; for an
        adapter policy the new adapter with b = 0, so the reference is the base itself)."""
        ref = jax.tree.map(jnp.copy, params) if reference else None
        return PolicyState(params, self.new_optimizer(params), ref)

    # ------------------------------------------------------------- batches
    def collate(self, rows: Rows) -> dict:
        mb = self.micro_batch_size
        if self.mesh is None:
            return jax.tree.map(
                jnp.asarray, collate(rows, micro_batch_size=mb, pad_id=self.pad_id, geometric=True)
            )
        # rows (axis 1) over the data-parallel axes; micro-batch index and length replicated
        spread = NamedSharding(self.mesh, PartitionSpec(None, ("data", "fsdp")))
        if spread.is_fully_addressable:
            batch = collate(rows, micro_batch_size=mb, pad_id=self.pad_id, geometric=True)
            return jax.tree.map(lambda x: jax.device_put(x, spread), batch)
        # multi-process: this process's rows fill its part of every micro-batch; all agree on [M, T]
        from jax.experimental import multihost_utils

        spans = {
            (s[1].start or 0, s[1].stop or mb)
            for s in spread.addressable_devices_indices_map((1, mb)).values()
        }
        local_mb = sum(b - a for a, b in spans)
        batch = collate(rows, micro_batch_size=local_mb, pad_id=self.pad_id, geometric=True)
        M, T = (
            int(x) for x in multihost_utils.process_allgather(np.array(batch["tokens"].shape[::2])).max(0)
        )
        batch = _pad_batch(batch, M, T, self.pad_id)
        return {
            k: jax.make_array_from_process_local_data(spread, v, (M, mb) + v.shape[2:])
            for k, v in batch.items()
        }

    def _rl_inputs(self, state: PolicyState, batch: dict, k: int) -> None:
        """The RL step's extra inputs, computed before any step of the update: the PPO "old"
        log-probs, the reference's log-probs and the dropout seeds of mini-batch `k`."""
        if self.mini_batches > 1:
            batch["old_logp"] = self._logprobs(self.model_params(state.params), batch)
        if self.loss.kl_coef:
            batch["ref_logp"] = self._logprobs(self.model_params(state.ref_params), batch)
        self._add_dropout_seeds(state, batch, k)

    def _add_dropout_seeds(self, state: PolicyState, batch: dict, k: int) -> None:
        """Per micro-batch seeds of the adapter dropout masks (adapter policies with dropout)."""
        if not self.dropout:
            return
        M = batch["tokens"].shape[0]
        seeds = np.random.default_rng([self.seed, state.step, k]).integers(0, 2**32, M, dtype=np.uint32)
        batch["lora_seed"] = jnp.asarray(seeds)

    # ------------------------------------------------------------- updates
    def start_update(
        self, state: PolicyState, rows: Rows, agents: Sequence[str] | None = None
    ) -> tuple[PolicyState, list]:
        """One RL update on `rows` (`mini_batches` optimiser steps), dispatched without waiting for
        the devices: (the next state, its version bumped; the pending metrics for `finish_update`).
        Policies on disjoint devices therefore update at the same time.

        `agents` (the policy's agents, a fixed list so the diagnostic compiles once): also report
        `agent_grad_norm/<agent>`, the norm of the gradient of each agent's rows' loss alone
        at the parameters the step starts from, for the agents with rows in the batch
        (`make_agent_grad_norm_fn`; one more forward and backward pass per agent)."""
        order = np.random.default_rng([self.seed, state.version]).permutation(len(rows))
        chunks = [rows[c] for c in np.array_split(order, self.mini_batches) if len(c)]
        batches = [self.collate(c) for c in chunks]
        for k, b in enumerate(batches):
            self._rl_inputs(state, b, k)
        history = []
        params, opt_state = state.params, state.opt_state
        for c, b in zip(chunks, batches):  # metrics are read after the last step: steps queue up
            at = state.replace(params=params)
            extra = {} if agents is None else self._agent_grad_norms(at, b, c.agent, agents)
            params, opt_state, metrics = self._rl_update(params, opt_state, b, self.frozen)
            history.append({**metrics, **extra})
        return state.replace(params=params, opt_state=opt_state, version=state.version + 1), history

    def update(self, state: PolicyState, rows: Rows) -> tuple[PolicyState, dict[str, float]]:
        """`start_update`, waiting for its metrics."""
        state, pending = self.start_update(state, rows)
        return state, finish_update(pending)

    def sft_update(
        self, state: PolicyState, rows: Rows, optimizer: OptimizerConfig | None = None
    ) -> tuple[PolicyState, dict[str, float]]:
        """One supervised step: maximise the likelihood of the completions. `optimizer`: this
        step's optimiser settings instead of the policy's (another peak rate or schedule, as
        `marljax.train.sft` sets them; the optimiser's state has the same structure)."""
        batch = self.collate(rows)
        self._add_dropout_seeds(state, batch, 0)
        step = self._sft_update
        if optimizer is not None and optimizer != self.optimizer_cfg:
            step = step_functions(
                self.config, optimizer, self.loss, self.mini_batches > 1, self.lora, self.mesh
            )[2]
        params, opt_state, metrics = step(state.params, state.opt_state, batch, self.frozen)
        return state.replace(params=params, opt_state=opt_state), _to_float(metrics)

    # --------------------------------------------------------- diagnostics
    def agent_grad_norms(self, state: PolicyState, rows: Rows, agents: Sequence[str]) -> dict[str, float]:
        """`{agent: norm}` of the gradient of each agent's rows' loss alone at the state's
        parameters, without updating (e.g. the same rows under another advantage
        normalisation); the agents of `agents` with rows in `rows` only."""
        batch = self.collate(rows)
        self._rl_inputs(state, batch, 0)
        norms = self._agent_grad_norms(state, batch, rows.agent, agents)
        return {k.split("/", 1)[1]: float(v) for k, v in norms.items()}

    def _agent_grad_norms(
        self, state: PolicyState, batch: dict, names: Sequence[str], agents: Sequence[str]
    ) -> dict:
        """`agent_grad_norm/<agent>` (device scalars) for the agents of `agents` with rows in `batch`;
        `names`: the agent of each of its rows, in order (`collate` keeps the rows' order)."""
        if self.mesh is not None and not batch["advantages"].sharding.is_fully_addressable:
            raise NotImplementedError("per-agent gradient norms are not supported on multi-process runs")
        rows = np.full(batch["advantages"].size, -1, np.int32)
        index = {a: k for k, a in enumerate(agents)}
        rows[: len(names)] = [index.get(a, -1) for a in names]
        rows = jax.device_put(rows.reshape(batch["advantages"].shape), batch["advantages"].sharding)
        fn = _agent_norm_function(self.config, self.loss, self.mini_batches > 1, self.lora, self.mesh)
        norms = fn(state.params, batch, rows, len(agents), self.frozen)
        return {f"agent_grad_norm/{a}": norms[index[a]] for a in dict.fromkeys(names) if a in index}
