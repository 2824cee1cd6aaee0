"""A trainable policy: a decoder's parameters, its tokenizer, optimiser, loss settings and mesh.

Several agents may share one policy (a homogeneous team with role prompts) or
each have their own (a heterogeneous team of different families and sizes).
The policy owns plain parameter pytrees (`get_params` layout) and jitted
update functions; `version` counts completed RL updates and tags the samples
its parameters generate, so the trainer can measure staleness.

Layouts. The trainer's layout is `mesh` (e.g. FSDP over `fsdp`, Megatron
splits over `tensor`); the sampler may use another one (`sampler_mesh`, e.g.
data x tensor, which needs no all-gathers per decoded token). Parameters then
go to the sampler's layout on device (`marljax.models.sharding.reshard`), once
per optimiser step. On a multi-process run every process samples its own prompts on its
own devices from a per-process copy of the parameters (all-gathered on
device), and the update takes each process's samples as its share of the
rows of every micro-batch (`jax.make_array_from_process_local_data`).

Adapter policies (`lora:`) train a LoRA adapter on a frozen base (`marljax.models.lora`):
`params` is the adapter alone, `base_params` the base, loaded once per model and mesh into a
`BaseStore` that every adapter policy on that base shares (one copy of the base weights in
memory). Each adapter has its own optimiser state (over the adapter only), learning rate, loss
settings and checkpoints (the adapter and its optimiser state; the base is not saved). Its KL
reference is the base with the adapter as it started (`b` = 0: exactly the base), so no second
copy of the base exists.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from marljax.models.chat import encode_continuation, encode_prompt, generation_eos_ids, use_chat
from marljax.models.config import ModelConfig
from marljax.models.decoder import abstract_model, get_params, init_model, param_dict_shardings, set_params
from marljax.models.hf_io import from_pretrained, load_tokenizer, save_peft_adapter, save_pretrained
from marljax.models.lora import LoraSpec, init_adapter, merge, stack_adapters
from marljax.models.sharding import make_mesh, process_local_mesh, reshard, to_local
from marljax.sampler import generate
from marljax.sampler.schedule import Buckets, Schedule
from marljax.train.batch import collate
from marljax.train.config import LossConfig, OptimizerConfig
from marljax.train.optim import applied_steps, make_optimizer, make_schedule
from marljax.train.update import (
    make_agent_grad_norm_fn,
    make_logprob_fn,
    make_update_fn,
    rl_loss,
    sft_loss,
)
from marljax.workflows.types import Sample


def policy_mesh(mesh_cfg: Any):
    """A mesh for the policy's `mesh` settings, or None for a plain single device."""
    devices = None
    if mesh_cfg.devices is not None:
        all_devices = jax.devices()
        bad = [d for d in mesh_cfg.devices if not 0 <= d < len(all_devices)]
        if bad:
            raise ValueError(f"mesh.devices {bad} out of range: {len(all_devices)} devices")
        devices = [all_devices[d] for d in mesh_cfg.devices]
    dcn = getattr(mesh_cfg, "dcn", None)
    dcn = {} if dcn is None else {"data": dcn.data, "fsdp": dcn.fsdp}
    if (
        mesh_cfg.data * mesh_cfg.fsdp * mesh_cfg.tensor * int(np.prod(list(dcn.values()))) == 1
        and devices is None
    ):
        return None
    return make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor, devices=devices, dcn=dcn)


def load_model(spec: Any, mesh=None, where: str = "model") -> tuple[ModelConfig, dict, Any]:
    """(config, params, tokenizer) from a local HF directory or a named preset.

    A preset without a `tokenizer` directory gets marljax's tiny byte-level
    BPE tokenizer (its vocabulary fits every tiny preset).
    """
    if spec.path is not None:
        model, config = from_pretrained(
            spec.path,
            dtype=spec.dtype,
            param_dtype=spec.param_dtype,
            mesh=mesh,
            remat=spec.remat,
            attention_impl=spec.attention_impl,
            scan_layers=spec.scan_layers,
        )
        tokenizer = load_tokenizer(spec.tokenizer or spec.path)
    else:
        if spec.tokenizer is not None:
            tokenizer = load_tokenizer(spec.tokenizer)
        else:
            from marljax.models.tokenizer import make_tokenizer

            tokenizer = make_tokenizer()
        config = ModelConfig.preset(
            spec.preset,
            dtype=spec.dtype,
            param_dtype=spec.param_dtype,
            remat=spec.remat,
            attention_impl=spec.attention_impl,
            scan_layers=spec.scan_layers,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = init_model(config, seed=spec.seed, mesh=mesh)
    if len(tokenizer) > config.vocab_size:  # token ids past the embedding table would be clipped silently
        raise ValueError(
            f"{where}: {spec.path or spec.preset!r} has {config.vocab_size} embeddings but its tokenizer "
            f"({spec.tokenizer or spec.path or 'built in'}) has {len(tokenizer)} tokens"
        )
    return config, get_params(model), tokenizer


def _eos_ids(config: ModelConfig, tokenizer: Any, path: str | None) -> list[int]:
    """The config's EOS ids (else the tokenizer's), then those of `generation_config.json`: instruct
    models end a turn with a token (`<|im_end|>`, `<|eot_id|>`) listed there."""
    eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
    ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    return list(dict.fromkeys(ids + generation_eos_ids(path)))


def _pad_batch(batch: dict, M: int, T: int, pad_id: int) -> dict:
    """`collate` arrays padded to M micro-batches and length T with rows that carry no loss."""
    out = {}
    for k, v in batch.items():
        widths = [(0, M - v.shape[0]), (0, 0)] + ([(0, T - v.shape[2])] if v.ndim == 3 else [])
        fill = {"tokens": pad_id, "labels": pad_id, "temperature": 1.0}.get(k, 0)
        out[k] = np.pad(v, widths, constant_values=fill)
    out["positions"] = np.broadcast_to(np.arange(T, dtype=np.int32), out["tokens"].shape).copy()
    return out


def _counters_on(opt_state: Any, mesh) -> Any:
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


def with_adapter(adapter: dict, base: dict, *, spec: LoraSpec) -> dict:
    """The model parameters of an adapter policy: the frozen `base` with its one `adapter`."""
    return {**base, "lora": stack_adapters([(spec, adapter)])}


class BaseStore:
    """Frozen base models of adapter policies, loaded once per (model, mesh) and shared, and their
    copies in a sampler's layout, made once per (base, sampler mesh) and shared too."""

    def __init__(self):
        self._bases: dict = {}
        self._sampler_copies: dict = {}

    def get(self, spec: Any, mesh, where: str) -> tuple[ModelConfig, dict, Any]:
        """(config, params, tokenizer) of the model `spec` on `mesh`, loaded on first use."""
        key = (spec, mesh)
        if key not in self._bases:
            config, params, tokenizer = load_model(spec, mesh, where)
            if mesh is None:
                params = jax.device_put(params, jax.devices()[0])
            self._bases[key] = (config, params, tokenizer)
        return self._bases[key]

    def sampler_copy(self, base: dict, mesh, move) -> dict:
        """`move(base)`: the frozen `base` in the layout of the sampler `mesh`, made on first use."""
        key = (id(base), mesh)
        if key not in self._sampler_copies:  # the base is kept with its copy, so its id stays its own
            self._sampler_copies[key] = (base, move(base))
        return self._sampler_copies[key][1]

    def __len__(self) -> int:
        return len(self._bases)


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
    keep no state of their own, so sharing one is safe. With `lora`, the updates train the adapter on
    a frozen base (`update(adapter, opt_state, batch, base)`)."""
    optimizer, schedule = make_optimizer(optimizer_cfg), make_schedule(optimizer_cfg)
    combine = None if lora is None else functools.partial(with_adapter, spec=lora)
    dropout = 0.0 if lora is None else lora.dropout
    # the trainable parameters' layout, which the gradient accumulator keeps: the rule table's
    # for a full policy, replicated for an adapter
    shardings = None
    if mesh is not None:
        shardings = (
            param_dict_shardings(config, mesh) if lora is None else NamedSharding(mesh, PartitionSpec())
        )
    rl = make_update_fn(
        functools.partial(rl_loss, config=config, loss=loss, use_old_logp=use_old_logp, lora_dropout=dropout),
        optimizer,
        loss.agg_mode,
        schedule,
        combine,
        mesh,
        shardings,
    )
    sft = make_update_fn(
        functools.partial(sft_loss, config=config, lora_dropout=dropout),
        optimizer,
        "token-mean",
        schedule,
        combine,
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
    combine = None if lora is None else functools.partial(with_adapter, spec=lora)
    dropout = 0.0 if lora is None else lora.dropout
    return make_agent_grad_norm_fn(
        functools.partial(rl_loss, config=config, loss=loss, use_old_logp=use_old_logp, lora_dropout=dropout),
        loss.agg_mode,
        combine,
        mesh,
    )


class Policy:
    """One set of trainable weights with its optimiser; see the module doc."""

    def __init__(
        self,
        name: str,
        cfg: Any,
        *,
        norm_constant: float | None = None,
        seed: int = 0,
        model: Any = None,
        bases: BaseStore | None = None,
    ):
        """`model`: the model spec when `cfg` names a `base` policy instead of its own
        (`RunConfig.policy_model`); `bases`: the run's shared frozen bases (adapter policies)."""
        self.name, self.cfg = name, cfg
        model = cfg.model if model is None else model
        if model is None:
            raise ValueError(
                f"policies.{name}: no model (it names base {cfg.base!r}; pass that policy's model)"
            )
        self.mesh = policy_mesh(cfg.mesh)
        rows = 1 if self.mesh is None else self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if cfg.micro_batch_size % rows:
            raise ValueError(
                f"policies.{name}.micro_batch_size={cfg.micro_batch_size} must be a multiple of "
                f"mesh.data x mesh.fsdp = {rows} (rows are split over those axes)"
            )
        procs = jax.process_count()
        if procs > 1 and (
            self.mesh is None or len({d.process_index for d in self.mesh.devices.flat}) != procs
        ):
            raise ValueError(
                f"policies.{name}.mesh must use devices of all {procs} processes on a multi-process "
                f"run ({jax.device_count()} devices, {jax.local_device_count()} per process)"
            )
        self.model_spec = model
        self.lora: LoraSpec | None = None if cfg.lora is None else cfg.lora.spec()
        where = f"policies.{name}.model"
        if self.lora is None:
            self.base_params = None
            self.config, self.params, self.tokenizer = load_model(model, self.mesh, where)
        else:
            bases = BaseStore() if bases is None else bases
            self._bases = bases
            self.config, self.base_params, self.tokenizer = bases.get(model, self.mesh, where)
            self.params = init_adapter(self.config, self.lora, jax.random.key(cfg.lora.seed))
            if self.mesh is not None:  # adapters are small: a replicated copy on every device
                self.params = jax.device_put(self.params, NamedSharding(self.mesh, PartitionSpec()))
        self.chat = use_chat(cfg.chat, self.tokenizer, f"policies.{name}")
        self.eos_ids = _eos_ids(self.config, self.tokenizer, model.path)
        if self.mesh is None:  # committed, as loaded checkpoints and the update's outputs are
            self.params = jax.device_put(self.params, jax.devices()[0])
        self._sampler_setup(getattr(cfg, "sampler_mesh", None))
        # a copy, because the update donates (frees) the buffers of `params`; for an adapter policy
        # a copy of the new adapter (b = 0), so the reference is the base itself
        self.ref_params = jax.tree.map(jnp.copy, self.params) if cfg.reference else None
        self.loss = cfg.loss
        if self.loss.norm_constant is None:  # Dr.GRPO's constant defaults to the given generation budget
            self.loss = self.loss.model_copy(update={"norm_constant": norm_constant})
        self.seed = seed
        self.version = 0  # completed RL updates
        self.optimizer, self._rl_update, self._sft_update, self._logprobs = step_functions(
            self.config, cfg.optimizer, self.loss, cfg.mini_batches > 1, self.lora, self.mesh
        )
        self.reset_optimizer()

    # ------------------------------------------------------------ sampling
    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else 0)

    def encode_prompt(self, prompt: str) -> list[int]:
        """The token ids this policy's sampler gets for `prompt` (chat template or raw text); a prompt
        that continues this policy's earlier one starts with that one's exact tokens."""
        where = f"policies.{self.name}"
        after = getattr(prompt, "continues", None)
        if after is not None and after.policy == self.name:
            ids = encode_continuation(self.tokenizer, prompt, chat=self.chat, where=where)
            if ids is not None:
                return ids
        return encode_prompt(self.tokenizer, prompt, chat=self.chat, where=where)

    def encode_completion(self, text: str) -> list[int]:
        """The token ids of `text` written as this policy's turn: no BOS, ending with its first EOS id
        (a chat turn's end), as a completion it sampled to its end."""
        return [*self.tokenizer(text, add_special_tokens=False)["input_ids"], *self.eos_ids[:1]]

    def _sampler_setup(self, sampler_mesh_cfg: Any) -> None:
        """The sampler's layout: the trainer's, another mesh, or per-process copies (multi-process).
        `_to_sampler(tree, specs)` moves a tree of parameters there, each laid out by its spec."""
        self.sampler_mesh, self._to_sampler, self._sampler_cache = self.mesh, None, None
        self._team_cache = None
        mesh = self.mesh if sampler_mesh_cfg is None else policy_mesh(sampler_mesh_cfg)
        if jax.process_count() > 1:
            staging, self.sampler_mesh = process_local_mesh(mesh)
            local = self.sampler_mesh
            self._to_sampler = lambda tree, specs: to_local(
                tree, local_specs=specs, staging=staging, local=local
            )
        elif sampler_mesh_cfg is not None:
            self.sampler_mesh = mesh

            def move(tree, specs):
                if mesh is None:  # a one-device sampler
                    return jax.device_put(tree, jax.devices()[0])
                shardings = jax.tree.map(
                    lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
                )
                return reshard(tree, shardings)

            self._to_sampler = move

    def _model_specs(self) -> dict:
        """Partition specs of the model's parameters on the sampler's mesh (the base's, for an adapter
        policy)."""
        if self.sampler_mesh is None:
            return jax.tree.map(lambda _: PartitionSpec(), self.base_params if self.lora else self.params)
        return jax.tree.map(lambda s: s.spec, param_dict_shardings(self.config, self.sampler_mesh))

    def model_params(self, params: dict | None = None) -> dict:
        """The parameters the model maths takes: `params` (default the current ones) for a full
        policy; the shared base with the adapter `params` for an adapter policy."""
        params = self.params if params is None else params
        return params if self.lora is None else with_adapter(params, self.base_params, spec=self.lora)

    @property
    def base_key(self) -> int | None:
        """Adapter policies with equal keys share one base (and can sample in one call)."""
        return None if self.lora is None else id(self.base_params)

    def _own_in_sampler_layout(self) -> dict:
        """This policy's trainable parameters (the full model, or the adapter, replicated) in the
        sampler's layout, moved on device once per parameter change."""
        if self._to_sampler is None:
            return self.params
        if self._sampler_cache is None or self._sampler_cache[0] is not self.params:
            specs = (
                self._model_specs()
                if self.lora is None
                else jax.tree.map(lambda _: PartitionSpec(), self.params)
            )
            self._sampler_cache = (self.params, self._to_sampler(self.params, specs))
        return self._sampler_cache[1]

    def sampler_base(self) -> dict:
        """An adapter policy's frozen base in the sampler's layout: one copy per base and sampler
        mesh, shared by the adapters on it."""
        if self._to_sampler is None:
            return self.base_params
        return self._bases.sampler_copy(
            self.base_params, self.sampler_mesh, lambda base: self._to_sampler(base, self._model_specs())
        )

    def sync_sampler(self) -> None:
        """Multi-process runs: make the sampler's per-process copy of the current parameters now.
        Making it is a collective (an all-gather over the processes): made lazily by `generate`,
        it would hang as soon as one process samples this policy and another does not, so the
        trainer calls this on every process at the same points."""
        if jax.process_count() > 1 and self._to_sampler is not None:
            self.sampler_params()

    def sampler_params(self) -> dict:
        """The parameters in the sampler's layout (an adapter policy: its base with its adapter)."""
        if self.lora is not None:
            return with_adapter(self._own_in_sampler_layout(), self.sampler_base(), spec=self.lora)
        return self._own_in_sampler_layout()

    def _stacked(self, team: Sequence[Policy]) -> dict:
        """The team's adapters stacked for one sampling call, rebuilt only when the team or one of
        its adapters changed since the last call (a rollout samples the same team many times
        between updates)."""
        own = [p._own_in_sampler_layout() for p in team]
        cached = self._team_cache
        if (
            cached is None
            or len(cached[0]) != len(team)
            or any(a is not b for a, b in zip(cached[0], team))
            or any(a is not b for a, b in zip(cached[1], own))
        ):
            cached = self._team_cache = (
                list(team),
                own,
                stack_adapters([(p.lora, o) for p, o in zip(team, own)]),
            )
        return cached[2]

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int,
        seed: int,
        sampler: Any,
        settings: Sequence[Any] | None = None,
        team: Sequence[Policy] | None = None,
        adapter: int | Sequence[int] = 0,
    ):
        """`SamplerOutput` for `n` samples of each prompt (log-probs at the sampler's temperature).

        `sampler`: the run's `SamplerConfig` (slots, buckets, and the sampling settings unless
        `settings` gives each prompt its own: temperature, top_p, top_k, max_new_tokens; the stop
        strings are the first prompt's, one set per call). `team`: adapter policies on this
        policy's base (itself included) sampled in one call, prompt `i` with adapter
        `team[adapter[i]]`.
        """
        per = list(settings) if settings is not None else [sampler]
        if len(per) not in (1, len(prompt_ids)):
            raise ValueError(f"settings: one per prompt ({len(prompt_ids)}), got {len(per)}")
        if team is None:
            params = self.sampler_params()
        elif self.lora is None or any(
            p.base_key != self.base_key or p.sampler_mesh != self.sampler_mesh for p in team
        ):
            raise ValueError("a team samples together only as adapter policies on one base and sampler mesh")
        else:
            params = {**self.sampler_base(), "lora": self._stacked(team)}

        def each(key):
            values = [getattr(s, key) for s in per]
            return values[0] if len(values) == 1 else values

        stop = [self.tokenizer.encode(text, add_special_tokens=False) for text in per[0].stop]
        return generate(
            self.config,
            prompt_ids,
            params=params,
            n=n,
            seed=seed,
            max_new_tokens=each("max_new_tokens"),
            temperature=each("temperature"),
            top_p=each("top_p"),
            top_k=each("top_k"),
            stop=[s for s in stop if s],
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            mesh=self.sampler_mesh,
            buckets=Buckets(min_prompt=sampler.min_prompt_bucket, min_batch=sampler.min_batch_bucket),
            schedule=Schedule(slots=sampler.slots, share_prefixes=sampler.share_prefixes),
            adapter=adapter,
        )

    # ------------------------------------------------------------- updates
    def _collate(self, samples: Sequence[Sample]) -> dict:
        mb = self.cfg.micro_batch_size
        if self.mesh is None:
            return jax.tree.map(
                jnp.asarray, collate(samples, micro_batch_size=mb, pad_id=self.pad_id, geometric=True)
            )
        # rows (axis 1) over the data-parallel axes; micro-batch index and length replicated
        rows = NamedSharding(self.mesh, PartitionSpec(None, ("data", "fsdp")))
        if rows.is_fully_addressable:
            batch = collate(samples, micro_batch_size=mb, pad_id=self.pad_id, geometric=True)
            return jax.tree.map(lambda x: jax.device_put(x, rows), batch)
        # multi-process: this process's samples fill its rows of every micro-batch; all agree on [M, T]
        from jax.experimental import multihost_utils

        spans = {
            (s[1].start or 0, s[1].stop or mb) for s in rows.addressable_devices_indices_map((1, mb)).values()
        }
        local_mb = sum(b - a for a, b in spans)
        batch = collate(samples, micro_batch_size=local_mb, pad_id=self.pad_id, geometric=True)
        M, T = (
            int(x) for x in multihost_utils.process_allgather(np.array(batch["tokens"].shape[::2])).max(0)
        )
        batch = _pad_batch(batch, M, T, self.pad_id)
        return {
            k: jax.make_array_from_process_local_data(rows, v, (M, mb) + v.shape[2:])
            for k, v in batch.items()
        }

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One RL update on `samples` (`mini_batches` optimiser steps); bumps `version`."""
        return self.finish_update(self.start_update(samples))

    def start_update(self, samples: Sequence[Sample], agents: Sequence[str] | None = None) -> list:
        """Dispatch `update` without waiting for the devices; `finish_update` reads its metrics.
        Policies on disjoint devices therefore update at the same time.

        `agents` (the policy's agents, a fixed list so the diagnostic compiles once): also report
        `agent_grad_norm/<agent>`, the norm of the gradient of each agent's samples' loss alone
        at the parameters the step starts from, for the agents with samples in the batch
        (`make_agent_grad_norm_fn`; one more forward and backward pass per agent)."""
        order = np.random.default_rng([self.seed, self.version]).permutation(len(samples))
        chunks = [c for c in np.array_split(order, self.cfg.mini_batches) if len(c)]
        batches = [self._collate([samples[i] for i in c]) for c in chunks]
        for k, b in enumerate(batches):  # log-probs before any step of this update: the PPO "old" policy
            if self.cfg.mini_batches > 1:
                b["old_logp"] = self._logprobs(self.model_params(), b)
            if self.loss.kl_coef:
                b["ref_logp"] = self._logprobs(self.model_params(self.ref_params), b)
            self._add_dropout_seeds(b, k)
        history = []
        for c, b in zip(chunks, batches):  # metrics are read after the last step: steps queue up
            extra = {} if agents is None else self._agent_grad_norms(b, [samples[i].agent for i in c], agents)
            self.params, self.opt_state, metrics = self._rl_update(
                self.params, self.opt_state, b, *self._frozen()
            )
            history.append({**metrics, **extra})
        self.version += 1
        return history

    def agent_grad_norms(self, samples: Sequence[Sample], agents: Sequence[str]) -> dict[str, float]:
        """`{agent: norm}` of the gradient of each agent's samples' loss alone at the current
        parameters, without updating (e.g. the same samples under another advantage
        normalisation); the agents of `agents` with samples in `samples` only."""
        batch = self._collate(samples)
        if self.cfg.mini_batches > 1:
            batch["old_logp"] = self._logprobs(self.model_params(), batch)
        if self.loss.kl_coef:
            batch["ref_logp"] = self._logprobs(self.model_params(self.ref_params), batch)
        self._add_dropout_seeds(batch, 0)
        norms = self._agent_grad_norms(batch, [s.agent for s in samples], agents)
        return {k.split("/", 1)[1]: float(v) for k, v in norms.items()}

    def _agent_grad_norms(self, batch: dict, names: Sequence[str], agents: Sequence[str]) -> dict:
        """`agent_grad_norm/<agent>` (device scalars) for the agents of `agents` with rows in `batch`;
        `names`: the agent of each of its rows, in order (`collate` keeps the samples' order)."""
        if self.mesh is not None and not batch["advantages"].sharding.is_fully_addressable:
            raise NotImplementedError("per-agent gradient norms are not supported on multi-process runs")
        rows = np.full(batch["advantages"].size, -1, np.int32)
        index = {a: k for k, a in enumerate(agents)}
        rows[: len(names)] = [index.get(a, -1) for a in names]
        rows = jax.device_put(rows.reshape(batch["advantages"].shape), batch["advantages"].sharding)
        fn = _agent_norm_function(self.config, self.loss, self.cfg.mini_batches > 1, self.lora, self.mesh)
        norms = fn(self.params, batch, rows, len(agents), *self._frozen())
        return {f"agent_grad_norm/{a}": norms[index[a]] for a in dict.fromkeys(names) if a in index}

    def _frozen(self) -> tuple:
        """The update's extra argument: the frozen base of an adapter policy."""
        return () if self.lora is None else (self.base_params,)

    def _add_dropout_seeds(self, batch: dict, k: int) -> None:
        """Per micro-batch seeds of the adapter dropout masks (adapter policies with dropout)."""
        if self.lora is None or not self.lora.dropout:
            return
        M = batch["tokens"].shape[0]
        seeds = np.random.default_rng([self.seed, self.step, k]).integers(0, 2**32, M, dtype=np.uint32)
        batch["lora_seed"] = jnp.asarray(seeds)

    @staticmethod
    def finish_update(pending: list) -> dict[str, float]:
        history = [_to_float(m) for m in pending]
        keys = dict.fromkeys(k for h in history for k in h)  # an agent may miss some mini-batches
        out = {k: float(np.mean([h[k] for h in history if k in h])) for k in keys}
        out["skipped"] = float(sum(h["skipped"] for h in history))
        return out

    def sft_update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One supervised step: maximise the likelihood of the completions."""
        batch = self._collate(samples)
        self._add_dropout_seeds(batch, 0)
        self.params, self.opt_state, metrics = self._sft_update(
            self.params, self.opt_state, batch, *self._frozen()
        )
        return _to_float(metrics)

    @property
    def step(self) -> int:
        """Optimiser steps applied (RL and SFT) since the last `reset_optimizer`; skipped ones do not count."""
        return int(applied_steps(self.opt_state))

    def reset_optimizer(self) -> None:
        """A fresh optimiser state: moments at zero and the learning-rate schedule at its first step."""
        self.opt_state = _counters_on(self.optimizer.init(self.params), self.mesh)

    def reset_reference(self) -> None:
        """Make the current parameters the KL reference (e.g. after an SFT warm start)."""
        if self.ref_params is not None:
            self.ref_params = jax.tree.map(jnp.copy, self.params)

    # -------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """The checkpointed state; `step` is a copy of the optimiser state's count, for readers."""
        state = {
            "params": self.params,
            "opt_state": self.opt_state,
            "step": np.asarray(self.step, np.int64),
            "version": np.asarray(self.version, np.int64),
        }
        if self.ref_params is not None:
            state["ref_params"] = self.ref_params
        return state

    def load_state(self, state: dict) -> None:
        self.params, self.opt_state = state["params"], state["opt_state"]
        self.version = int(state["version"])
        if "ref_params" in state:
            self.ref_params = state["ref_params"]

    def release_state(self) -> None:
        """Drop the parameters, optimiser state and reference (before `load_state` replaces them)."""
        self.params = self.opt_state = self.ref_params = None
        self._sampler_cache = self._team_cache = None

    def abstract_state(self) -> dict:
        """`state()` as ShapeDtypeStructs with shardings: the restore target."""

        def abstract(x):
            if isinstance(x, jax.Array):
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            return x

        return jax.tree.map(abstract, self.state())

    def export(self, path, *, tokenizer: bool = True, merged: bool = False):
        """Write the current parameters as a Hugging Face directory (+ tokenizer). An adapter policy
        writes a PEFT adapter (for `peft` on the HF base), or with `merged` the base with the
        adapter folded in, as a full checkpoint."""
        tok = self.tokenizer if tokenizer else None
        if self.lora is not None and not merged:
            out = save_peft_adapter(
                self.config, self.lora, self.params, path, base_model=self.model_spec.path
            )
            if tok is not None and jax.process_index() == 0:
                tok.save_pretrained(str(out))
            return out
        params = self.params if self.lora is None else merge(self.base_params, self.lora, self.params)
        model = abstract_model(self.config)
        set_params(model, params)
        return save_pretrained(model, path, tokenizer=tok)
