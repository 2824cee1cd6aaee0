"""A policy of a run: its settings and the pieces that do its jobs, built from the run's config.

Several agents may share one policy (a homogeneous team with role prompts) or each have their own
(a heterogeneous team of different families and sizes). A `Policy` holds
- `turns`, its `TurnFormat` (tokenizer, chat mode, end-of-turn and pad ids: `marljax.models.chat`);
- `state`, its `PolicyState` (trainable parameters, optimiser state, KL reference, version: exactly
  what is checkpointed, `marljax.train.state`);
- `learner`, its `Learner` (the jitted update steps that map a state to the next: `marljax.train.learner`);
- `sampler`, its `SamplerView` (its weights in the sampler's layout: `marljax.train.sampling`).

Adapter policies (`lora:`) train a LoRA adapter on a frozen base (`marljax.models.lora`): the
state's `params` are the adapter alone; the base is loaded once per model and mesh into a
`BaseStore` that every adapter policy on that base shares (one copy of the base weights in memory).
Each adapter has its own optimiser state (over the adapter only), learning rate, loss settings and
checkpoints (the adapter and its optimiser state; the base is not saved). Its KL reference is the
base with the adapter as it started (`b` = 0: exactly the base), so no second copy of the base exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from marljax.models.chat import TurnFormat
from marljax.models.config import ModelConfig
from marljax.models.decoder import abstract_model, get_params, init_model, set_params
from marljax.models.hf_io import (
    CheckpointError,
    from_pretrained,
    load_tokenizer,
    save_peft_adapter,
    save_pretrained,
)
from marljax.models.lora import init_adapter, merge
from marljax.models.sharding import make_mesh
from marljax.train.config import MeshConfig, OptimizerConfig, PolicyConfig, PolicyModelConfig, RunConfig
from marljax.train.learner import Learner, finish_update
from marljax.train.sampling import SamplerView
from marljax.train.state import PolicyState
from marljax.workflows.types import Rows


def policy_mesh(mesh_cfg: MeshConfig) -> Mesh | None:
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


@contextlib.contextmanager
def _naming(key: str):
    """Prefix a CheckpointError with the config key that named the directory: the command line
    prints it as one line, and the path alone does not say which setting to fix."""
    try:
        yield
    except CheckpointError as e:
        raise CheckpointError(f"{key}: {e}") from None


def load_model(spec: PolicyModelConfig, mesh=None, where: str = "model") -> tuple[ModelConfig, dict, Any]:
    """(config, params, tokenizer) from a local HF directory or a named preset.

    A preset without a `tokenizer` directory gets marljax's tiny byte-level
    BPE tokenizer (its vocabulary fits every tiny preset). A directory that cannot be read is a
    CheckpointError naming the config key (`where.path`, `where.tokenizer`) before the directory.
    """
    if spec.path is not None:
        with _naming(f"{where}.path"):
            model, config = from_pretrained(
                spec.path,
                dtype=spec.dtype,
                param_dtype=spec.param_dtype,
                mesh=mesh,
                remat=spec.remat,
                attention_impl=spec.attention_impl,
                scan_layers=spec.scan_layers,
            )
        with _naming(f"{where}.tokenizer" if spec.tokenizer else f"{where}.path"):
            tokenizer = load_tokenizer(spec.tokenizer or spec.path)
    else:
        if spec.tokenizer is not None:
            with _naming(f"{where}.tokenizer"):
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
        raise CheckpointError(
            f"{where}: {spec.path or spec.preset!r} has {config.vocab_size} embeddings but its tokenizer "
            f"({spec.tokenizer or spec.path or 'built in'}) has {len(tokenizer)} tokens"
        )
    return config, get_params(model), tokenizer


class BaseStore:
    """Frozen base models of adapter policies, loaded once per (model, mesh) and shared, and their
    copies in a sampler's layout, made once per (base, sampler mesh) and shared too."""

    def __init__(self):
        self._bases: dict = {}
        self._sampler_copies: dict = {}

    def get(self, spec: PolicyModelConfig, mesh, where: str) -> tuple[ModelConfig, dict, Any]:
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


class Policy:
    """One policy of a run; see the module doc. `model`: the model spec when `cfg` names a `base`
    policy instead of its own (`RunConfig.policy_model`); `bases`: the run's shared frozen bases."""

    def __init__(
        self,
        name: str,
        cfg: PolicyConfig,
        *,
        norm_constant: float | None = None,
        seed: int = 0,
        model: PolicyModelConfig | None = None,
        bases: BaseStore | None = None,
    ):
        self.name, self.cfg = name, cfg
        model = cfg.model if model is None else model
        if model is None:
            raise ValueError(
                f"policies.{name}: no model (it names base {cfg.base!r}; pass that policy's model)"
            )
        mesh = policy_mesh(cfg.mesh)
        _check_mesh(name, cfg, mesh)
        self.model_spec = model
        lora = None if cfg.lora is None else cfg.lora.spec()
        bases = BaseStore() if bases is None else bases
        frozen = None
        if lora is None:
            self.config, params, tokenizer = load_model(model, mesh, f"policies.{name}.model")
            if mesh is None:  # committed, as loaded checkpoints and the update's outputs are
                params = jax.device_put(params, jax.devices()[0])
        else:
            self.config, frozen, tokenizer = bases.get(model, mesh, f"policies.{name}.model")
            params = init_adapter(self.config, lora, jax.random.key(cfg.lora.seed))
            # adapters are small: a replicated copy on every device
            params = jax.device_put(
                params, jax.devices()[0] if mesh is None else NamedSharding(mesh, PartitionSpec())
            )
        with _naming(f"policies.{name}.model.path"):  # its generation_config.json's eos ids
            self.turns = TurnFormat.of(
                name, tokenizer, chat=cfg.chat, eos=self.config.eos_token_id, path=model.path
            )
        loss = cfg.loss
        if loss.norm_constant is None:  # Dr.GRPO's constant defaults to the given generation budget
            loss = loss.model_copy(update={"norm_constant": norm_constant})
        self.learner = Learner(
            self.config,
            cfg.optimizer,
            loss,
            micro_batch_size=cfg.micro_batch_size,
            mini_batches=cfg.mini_batches,
            mesh=mesh,
            lora=lora,
            frozen=frozen,
            pad_id=self.turns.pad_id,
            seed=seed,
        )
        sampler_mesh_cfg = cfg.sampler_mesh
        self.sampler = SamplerView(
            self.config,
            self.turns,
            trainable=lambda: self.state.params,
            frozen=frozen,
            lora=lora,
            sampler_mesh=mesh if sampler_mesh_cfg is None else policy_mesh(sampler_mesh_cfg),
            own_sampler_mesh=sampler_mesh_cfg is not None,
            bases=bases,
        )
        self.state: PolicyState | None = self.learner.initial_state(params, reference=cfg.reference)

    @property
    def params(self) -> dict:
        return self.state.params

    @property
    def version(self) -> int:
        return self.state.version

    # ------------------------------------------------------------- updates
    def update(self, rows: Rows) -> dict[str, float]:
        """One RL update on `rows` (`Learner.start_update`); bumps `version`."""
        return finish_update(self.start_update(rows))

    def start_update(self, rows: Rows, agents: Sequence[str] | None = None) -> list:
        """Dispatch an RL update (`Learner.start_update`); `finish_update` reads its metrics."""
        self.sampler.forget()  # the sampler's copies are of the parameters this update replaces
        self.state, pending = self.learner.start_update(self.state, rows, agents)
        return pending

    finish_update = staticmethod(finish_update)

    def sft_update(self, rows: Rows, optimizer: OptimizerConfig | None = None) -> dict[str, float]:
        """One supervised step on `rows` (`Learner.sft_update`; `optimizer`: other optimiser
        settings for this step, such as SFT's rate and schedule)."""
        self.sampler.forget()
        self.state, metrics = self.learner.sft_update(self.state, rows, optimizer)
        return metrics

    def reset_optimizer(self) -> None:
        """A fresh optimiser state: moments at zero and the learning-rate schedule at its first step."""
        self.state = self.state.replace(opt_state=self.learner.new_optimizer(self.state.params))

    def reset_reference(self) -> None:
        """Make the current parameters the KL reference (e.g. after an SFT warm start)."""
        if self.state.ref_params is not None:
            self.state = self.state.replace(ref_params=jax.tree.map(jnp.copy, self.state.params))

    def release_state(self) -> None:
        """Drop the state and the sampler's copies of it (before a restored state replaces them)."""
        self.state = None
        self.sampler.forget()

    # -------------------------------------------------------------- export
    def export(self, path, *, tokenizer: bool = True, merged: bool = False):
        """Write the current parameters as a Hugging Face directory (+ tokenizer). An adapter policy
        writes a PEFT adapter (for `peft` on the HF base), or with `merged` the base with the
        adapter folded in, as a full checkpoint."""
        tok = self.turns.tokenizer if tokenizer else None
        lora, base = self.learner.lora, self.learner.frozen
        if lora is not None and not merged:
            out = save_peft_adapter(self.config, lora, self.params, path, base_model=self.model_spec.path)
            if tok is not None and jax.process_index() == 0:
                tok.save_pretrained(str(out))
            return out
        params = self.params if lora is None else merge(base, lora, self.params)
        model = abstract_model(self.config)
        set_params(model, params)
        return save_pretrained(model, path, tokenizer=tok)


def _check_mesh(name: str, cfg: PolicyConfig, mesh) -> None:
    rows = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    if cfg.micro_batch_size % rows:
        raise ValueError(
            f"policies.{name}.micro_batch_size={cfg.micro_batch_size} must be a multiple of "
            f"mesh.data x mesh.fsdp = {rows} (rows are split over those axes)"
        )
    procs = jax.process_count()
    if procs > 1 and (mesh is None or len({d.process_index for d in mesh.devices.flat}) != procs):
        raise ValueError(
            f"policies.{name}.mesh must use devices of all {procs} processes on a multi-process "
            f"run ({jax.device_count()} devices, {jax.local_device_count()} per process)"
        )


def build_policy(cfg: RunConfig, name: str, bases: BaseStore) -> Policy:
    """Policy `name` of the run `cfg`, its adapters' bases taken from (or loaded into) `bases`."""
    # Dr.GRPO's constant: the generation budget (the largest of the policy's agents)
    budgets = [cfg.agent_sampling(a).max_new_tokens for a, c in cfg.agents.items() if c.policy == name]
    return Policy(
        name,
        cfg.policies[name],
        norm_constant=float(max(budgets, default=cfg.sampler.max_new_tokens)),
        seed=cfg.seed,
        model=cfg.policy_model(name),
        bases=bases,
    )


def build_policies(cfg: RunConfig, bases: BaseStore | None = None) -> dict[str, Policy]:
    """Every policy of the run `cfg` by name; adapter policies on one model share one frozen base
    (`bases`, a new store unless given)."""
    bases = BaseStore() if bases is None else bases
    return {name: build_policy(cfg, name, bases) for name in sorted(cfg.policies)}
